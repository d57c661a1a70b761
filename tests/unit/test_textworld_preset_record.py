"""docs/train.md's table of the textworld preset's runs agrees with their records in
results/textworld_preset (summary.json, metrics.jsonl and /usr/bin/time's lines of each seed)."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_textworld_preset_table_matches_its_records():
    doc = (ROOT / "docs" / "train.md").read_text()
    for seed in (0, 1, 2):
        rec = ROOT / "results" / "textworld_preset" / f"seed-{seed}"
        s = json.loads((rec / "summary.json").read_text())
        b, a = s["eval_before"], s["eval_after"]
        train = [json.loads(x) for x in (rec / "metrics.jsonl").read_text().splitlines()]
        curve = " ".join(f"{r['success_rate']:.2f}" for r in train if "reward_mean" in r)
        times = (rec / "time.txt").read_text()
        m, sec = re.search(r"Elapsed.*: (\d+):([\d.]+)", times).groups()
        rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", times).group(1)) / 1e6
        row = (f"| {seed} | {b['avg@k']:.3f} -> **{a['avg@k']:.3f}** | {b['pass@k']:.3f} -> {a['pass@k']:.3f} | "
               f"{int(m)} min {round(float(sec))} s | {rss:.1f} GB | {curve} |")
        assert row in doc, row


def test_the_trap_warmup_sizing_table_matches_its_records():
    """docs/experiments.md's sizing table of compare_trap_oracle's warm-up agrees with the probes'
    summaries in results/trap_warmup_sizing (the held-out evaluation before RL and its counters)."""
    doc = (ROOT / "docs" / "experiments.md").read_text()
    rows = {"t3-p0.3": "| P 0.3 (512 demonstrations, 6 epochs) |", "t3-p0.3-ep12": "| P 0.3, 12 epochs |",
            "t3-p0.3-w128": "| P 0.3, a 128-wide model |", "t3-p0.5": "| P 0.5 |",
            "t3-p0.3-e2048": "| **P 0.3, 2048 demonstrations** (the experiment's) |"}
    for name, head in rows.items():
        b = json.loads((ROOT / "results" / "trap_warmup_sizing" / name / "summary.json").read_text())["eval_before"]
        e = b["env"]
        deep = f"**{e['deep']:.3f}**" if name == "t3-p0.3-e2048" else f"{e['deep']:.3f}"
        row = f"{head} {b['avg@k']:.3f} | {deep} | {e['guess']:.3f} | {e['vault']:.3f}"
        assert row in doc, row
