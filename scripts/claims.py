"""Every published table, written from the committed records (issue 32).

    .venv/bin/python scripts/claims.py --write   # rewrite every generated block in README.md and docs/
    .venv/bin/python scripts/claims.py --check   # exit 1 and show the difference where a block is stale

A generated block sits between two markers in a markdown file:

    <!-- claims:KIND:ARGS -->
    ...written by this script, never by hand...
    <!-- /claims:KIND:ARGS -->

Kinds:
- ``arms:EXPERIMENT`` — the experiment's per-arm table from its records in ``results/EXPERIMENT``
  (restored into a temporary sweep folder, then ``seeupo.sweep.report.results``): seeds, metric after
  RL with Student's t interval, gain, the paired difference from the reference with its interval,
  the exact sign-flip p-value, Holm's p_holm across the experiment's arms, the detectable difference,
  collapses, drawdown;
- ``robustness`` / ``robustness-onecpu`` — ``scripts/robustness_table.py``'s tables of ``results/
  robustness`` (the second with the arms of ``results/robustness_intel`` in place of the same-named
  arms: every ``lookup`` pair on one CPU kind); ``robustness-of:NAME[:ALGO]`` the same tables of
  ``results/NAME`` (an experiment with robustness' arm names), with ``--loss-vs ALGO``'s table;
- ``coverage`` — ``scripts/coverage.py``'s simulation (seeded);
- ``pairs:EXPERIMENT`` — a declared family of paired contrasts (``PAIRS``: e.g. ``adapters``' per-turn
  adapter against the one-adapter capacity control), each with its t interval, exact p and Holm's
  p_holm across the family;
- ``env:EXPERIMENT`` — the environment's per-episode counters of the held-out evaluation before and
  after RL (``eval_before.env`` / ``eval_after.env`` in each trial's summary.json; e.g. the trap
  family's deep path, guess and vault), per arm: the means over seeds and the paired change
  after - before with its t interval, exact p and Holm's p_holm across every row of the table;
- ``turns:EXPERIMENT`` / ``turns:EXPERIMENT:ARM,ARM`` — the report's per-turn tables of those arms
  (training iterations' early third -> late third per turn, and when each turn's success and
  advantage moved: the half-rise);
- ``seeds:EXPERIMENT`` — each arm's metric after RL on every seed;
- ``provenance:EXPERIMENT`` — where and how long its trials ran, from each restored trial's
  ``summary.json`` (``platforms``, ``wall_seconds``): per platform the arms and seeds, the trial count and
  each trial's wall time (median, range, sum); the readings name no machine or day, this table does;
- ``tuned:EXPERIMENT`` — a tuned experiment's chosen configurations (its ``tuned.json``): per tuned
  arm the values chosen, the tuning score, the number of tuning trials and of distinct configurations among them;
- ``lab-limits`` / ``lab-turn-rows`` / ``lab-reach-turn`` — ``seeupo lab limits``' table and the
  turn-level algorithms' rows of ``seeupo lab table1`` and ``seeupo lab reach``, from
  ``results/lab/{limits,table1,reach}.json`` (those commands' JSON without the ``curves`` key);
- ``findings`` — the README's table of main findings: chosen contrasts from the records, each with its
  interval, p_holm and the word the statistics allow ("higher"/"lower" only where p_holm < 0.05).

``tests/integration/test_claims.py`` runs ``--check`` on a clean checkout: a changed digit in a block,
or a record that no longer gives it, fails the suite.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import importlib.util
import io
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- claims:(?P<spec>[^ ]+) -->\n)(?P<body>.*?)(<!-- /claims:(?P=spec) -->)", re.S)
_TMP = tempfile.TemporaryDirectory(prefix="seeupo-claims-")


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"claims_{name}", ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=None)
def experiment_path(name: str) -> str:
    """A shipped experiment's name, or the YAML file under scripts/ that defines it."""
    local = ROOT / "scripts" / f"{name}.yaml"
    return str(local) if local.exists() else name


@functools.lru_cache(maxsize=None)
def sweep_folder(name: str) -> Path:
    """The experiment's records restored into a temporary sweep folder (once per process)."""
    from seeupo.sweep import records
    from seeupo.sweep.engine import SweepSpec
    from seeupo.sweep.experiment import load_experiment

    if not (RESULTS / name).is_dir():
        raise SystemExit(f"no records for {name!r}: results/{name}/ does not exist")
    exp = load_experiment(experiment_path(name))
    out = Path(_TMP.name) / name
    out.mkdir(parents=True, exist_ok=True)
    counts = records.restore(SweepSpec(exp, out, quick=False), RESULTS / name)
    if not counts["restored"]:
        raise SystemExit(f"results/{name}/ restored no trial ({counts})")
    return out


@functools.lru_cache(maxsize=None)
def results(name: str) -> dict:
    """An experiment's results.json tree from its records; ``robustness-onecpu``: `robustness`'s
    `lookup` arms with those of `robustness_intel` in place of the same-named ones (one CPU kind)."""
    if name == "robustness-onecpu":
        import json

        theirs = {a["name"]: a for a in results("robustness_intel")["arms"]}
        res = json.loads(json.dumps(results("robustness")))
        res["arms"] = [theirs.get(a["name"], a) for a in res["arms"] if a["name"].startswith("lookup-")]
        return res
    from seeupo.sweep.experiment import load_experiment
    from seeupo.sweep.report import results as report_results

    exp = load_experiment(experiment_path(name))
    return report_results(sweep_folder(name), experiment=exp.name, metric=exp.metric, reference=exp.reference,
                          arms_order=[*exp.arms, *((exp.tune.arms if exp.tune else {}) or {})],
                          primary=exp.primaries(), margin=exp.margin)


def _ci(ci) -> str:
    return "-" if ci[0] != ci[0] else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def _p(p) -> str:
    return "-" if p is None or p != p else f"{p:.3f}"


def _verdict_cell(a: dict) -> str:
    """An arm's contrast with the reference: the primary's verdict with its p_holm, or "exploratory"."""
    from seeupo.sweep.report import verdict_phrase

    if a.get("exploratory", True) or a.get("verdict") is None:
        return "exploratory"
    return f"{verdict_phrase({**a, 'margin': a.get('margin', 0)})} (p_holm {a['p_holm']:.3f})"


def arms_table(name: str) -> str:
    from seeupo.sweep.report import gain_words

    res = results(name)
    ref = res["reference"]
    lines = [f"| arm | seeds | {res['metric']} after | 95% CI | gain | gain test | diff vs {ref} | 95% CI | p | "
             "verdict | collapses | drawdown |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in res["arms"]:
        is_ref = a["name"] == ref
        dd = a.get("drawdown_mean", float("nan"))
        diff = "(reference)" if is_ref else f"{a['diff_vs_reference']:+.3f}"
        gain = f"{gain_words(a['gain_verdict'])} (p_holm {a['gain_p_holm']:.3f})"
        lines.append(f"| {a['name']} | {a['n']} | {a['mean']:.3f} | {_ci(a['ci95']).replace('+', '')} | "
                     f"{a['gain_mean']:+.3f} | {gain} | {diff} | {'' if is_ref else _ci(a['diff_ci95'])} | "
                     f"{_p(a.get('p'))} | {'' if is_ref else _verdict_cell(a)} | {a['collapses']} | "
                     f"{'-' if dd != dd else f'{dd:.3f}'} |")
    from seeupo.sweep.experiment import load_experiment

    declared_pairs = load_experiment(experiment_path(name)).primaries()
    kind = ("Primary contrasts (declared before the trials ran): " + ", ".join(f"`{a} - {b}`" for a, b in declared_pairs)
            + "; every other difference is exploratory" if declared_pairs else
            "No primary contrast was declared: every difference is exploratory (an estimate, no verdict)")
    lines += ["", f"Records: `results/{name}/` ({sum(a['n'] for a in res['arms'])} trials). {kind}. Gain test: the "
              "exact sign-flip test of after - before, Holm across the arms (rose / fell only where p_holm < 0.05)."]
    return "\n".join(lines)


def env_rows(name: str) -> list[tuple[str, str, float, float, dict]]:
    """``(arm, counter, before mean, after mean, paired contrast of after - before)`` for every counter
    the environment reports, with ``p_holm`` across all rows."""
    import json

    from seeupo.sweep.stats import contrast, holm, mean

    res = results(name)
    rows = []
    for a in res["arms"]:
        per_seed = {}
        for path in sorted((sweep_folder(name) / "trials" / a["name"]).glob("seed-*/summary.json")):
            s = json.loads(path.read_text())
            before, after = s["eval_before"].get("env") or {}, s["eval_after"].get("env") or {}
            for k in sorted(set(before) & set(after)):
                per_seed.setdefault(k, []).append((before[k], after[k]))
        for k, pairs in per_seed.items():
            rows.append((a["name"], k, mean([b for b, _ in pairs]), mean([x for _, x in pairs]),
                         contrast([x - b for b, x in pairs])))
    if not rows:
        raise SystemExit(f"{name}: no trial's summary.json has environment counters (eval_before.env)")
    for row, ph in zip(rows, holm([r[4]["p"] for r in rows])):
        row[4]["p_holm"] = ph
    return rows


def env_table(name: str) -> str:
    lines = ["| arm | counter | before RL | after RL | change [95% CI] | seeds | p | reading |",
             "|---|---|---|---|---|---|---|---|"]
    rows = env_rows(name)
    for arm, k, b, x, c in rows:
        lines.append(f"| {arm} | {k} | {b:.3f} | {x:.3f} | {c['diff']:+.3f} {_ci(c['diff_ci95'])} | {c['pairs']} | "
                     f"{_p(c['p'])} | exploratory |")
    trapped = [(a["name"], a["trapped"], a["n"]) for a in results(name)["arms"] if a.get("trapped") is not None]
    tail = ("" if not trapped else "\n\nRuns that ended in the trap (most episodes of their last 5 training "
            "iterations took the guess): " + ", ".join(f"{n} {t} of {k}" for n, t, k in trapped) + ".")
    return "\n".join(lines) + (f"\n\nShare of held-out episodes, mean over seeds; change paired by seed, with the "
                               f"unadjusted exact p; exploratory (no counter was a declared primary), so no row "
                               f"carries a verdict: as a family of {len(rows)} none could have been declared at "
                               "these seeds.") + tail


def turns_table(spec: str) -> str:
    """``EXPERIMENT`` or ``EXPERIMENT:ARM,ARM``: the report's per-turn tables (training iterations, early
    third -> late third, and each turn's half-rise) of those arms (all by default), from the records."""
    from seeupo.sweep.report import collect
    from seeupo.sweep.turns import pooled_summary, summary_markdown

    name, _, arms = spec.partition(":")
    trials = collect(sweep_folder(name))
    chosen = arms.split(",") if arms else [a["name"] for a in results(name)["arms"]]
    lines = []
    for arm in chosen:
        if arm not in trials:
            raise SystemExit(f"{name}: no trials of arm {arm!r} in its records")
        lines += summary_markdown(pooled_summary([t["records"] for t in trials[arm].values()]), f"**{arm}**") + [""]
    return "\n".join(lines).rstrip("\n")


def tuned_table(name: str) -> str:
    tuned = results(name).get("tuned") or {}
    if not tuned:
        raise SystemExit(f"{name}: no tuned arm in its records")
    keys = sorted({k for t in tuned.values() for k in t["params"]})
    lines = ["| arm | " + " | ".join(f"`{k}`" for k in keys) + " | tuning score | tuning trials | distinct configurations |",
             "|---|" + "---|" * len(keys) + "---|---|---|"]
    for arm, t in tuned.items():
        vals = [str(t["params"].get(k, "-")) for k in keys]
        distinct = len({tuple(sorted(sc["params"].items())) for sc in t.get("scores", [])})
        lines.append(f"| {arm} | " + " | ".join(vals) + f" | {t['value']:.3f} | {t['trials']} | {distinct} |")
    return "\n".join(lines)


def seeds_table(name: str) -> str:
    """Each arm's metric after RL on every seed (to see which seeds carry a mean or collapse)."""
    res = results(name)
    seeds = sorted({int(s) for a in res["arms"] for s in a["per_seed"]})
    lines = ["| arm | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for a in res["arms"]:
        cells = [a["per_seed"].get(str(s), {}).get("after") for s in seeds]
        lines.append(f"| {a['name']} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in cells) + " |")
    return "\n".join(lines) + f"\n\n{res['metric']} after RL per seed."


def _seed_ranges(seeds) -> str:
    """``[0, 1, 2, 4]`` -> ``0-2, 4``.

    >>> _seed_ranges([0, 1, 2, 4, 6, 7])
    '0-2, 4, 6-7'
    """
    seeds, out = sorted(seeds), []
    for s in seeds:
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


def _walls(walls: list[float]) -> str:
    """Median [min, max] of trial wall times, in seconds or, where the median is 10 minutes or more, minutes.

    >>> _walls([100, 200, 700])
    '200 s [100, 700]'
    """
    import statistics

    med = statistics.median(walls)
    unit, f = ("min", lambda x: f"{x / 60:.1f}") if med >= 600 else ("s", lambda x: f"{x:.0f}")
    return f"{f(med)} {unit} [{f(min(walls))}, {f(max(walls))}]"


def provenance_table(name: str) -> str:
    """``provenance:EXPERIMENT``: where each trial of the experiment's records ran and how long it took,
    per platform (``seeupo.sweep.report.platform_label``: the CPU with the kernel level torch dispatched,
    a GPU if any, the packages): the arms (with the seeds, where not all of an arm's seeds ran there),
    the trials, each trial's ``wall_seconds`` (median and range) and their sum. The readings leave
    where and when to this table and the records."""
    import json
    from collections import defaultdict

    from seeupo.sweep.report import platform_label

    res, folder = results(name), sweep_folder(name)
    by = defaultdict(lambda: defaultdict(list))  # platform -> arm -> [(seed, wall)]
    threads: set = set()
    for a in res["arms"]:
        for s in sorted(a["per_seed"], key=int):
            summ = json.loads((folder / "trials" / a["name"] / f"seed-{s}" / "summary.json").read_text())
            by[platform_label(summ)][a["name"]].append((int(s), summ["wall_seconds"]))
            threads.update(p.get("threads") for p in summ.get("platforms") or [])
    n_seeds = {a["name"]: len(a["per_seed"]) for a in res["arms"]}
    lines = ["| platform | arms (seeds) | trials | wall time per trial: median [min, max] | sum |", "|---|---|---|---|---|"]
    for plat, arms in sorted(by.items(), key=lambda kv: (-sum(len(v) for v in kv[1].values()), kv[0])):
        walls = [w for v in arms.values() for _, w in v]
        if len(by) == 1:
            cell = "every arm"
        elif len(arms) > 8:
            cell = f"{len(arms)} arms" + ("" if all(len(v) == n_seeds[k] for k, v in arms.items()) else ", some seeds")
        else:
            cell = ", ".join(k if len(v) == n_seeds[k] else f"{k} ({_seed_ranges(s for s, _ in v)})"
                             for k, v in arms.items())
        lines.append(f"| {plat} | {cell} | {len(walls)} | {_walls(walls)} | {sum(walls) / 3600:.1f} h |")
    return "\n".join(lines) + (
        f"\n\nWhere the {sum(len(v) for p in by.values() for v in p.values())} trials of `{name}` ran (each trial's "
        "`platforms` in its summary.json; " + ("one thread each" if threads == {1} else
        "threads " + ", ".join(sorted(map(str, threads)))) + ") and their `wall_seconds`: a trial's run summed over its "
        "resumptions, including any time it shared its cores with other work or stood paused.")


def agents_table(name: str) -> str:
    """``agents``: the example agent's runs (``results/NAME/agent-seed-S``: `seeupo train --preset tiny --agent
    examples/agents/lookup_agent.py:run --seed S`) beside the built-in `lookup` path's on the same machine and
    seeds (``results/NAME/builtin-seed-S``: `seeupo train --preset tiny --seed S`), and the built-in path's
    spread over `compare`'s 8 seeds of its `seeupo` arm (the same configuration, another CPU)."""
    import json

    def runs(kind):
        found = {int(p.parent.name.rsplit("-", 1)[1]): json.loads(p.read_text())
                 for p in (RESULTS / name).glob(f"{kind}-seed-*/summary.json")}
        return dict(sorted(found.items()))

    agent, builtin = runs("agent"), runs("builtin")
    if not agent:
        raise SystemExit(f"no runs in results/{name}/agent-seed-*/summary.json")
    spread = [v["after"] for a in results("compare")["arms"] if a["name"] == "seeupo" for v in a["per_seed"].values()]
    lo, hi = min(spread), max(spread)

    def cells(s):
        if s is None:
            return "- | - | -"
        b, a = s["eval_before"]["avg@k"], s["eval_after"]["avg@k"]
        return f"{b:.3f} -> {a:.3f} | {a - b:+.3f} | {s['wall_seconds']:.0f} s"

    lines = ["| seed | agent: avg@4 before -> after | gain | wall | built-in: avg@4 before -> after | gain | wall | "
             "agent's after within compare's spread |", "|---|---|---|---|---|---|---|---|"]
    for seed, s in agent.items():
        inside = "yes" if lo <= s["eval_after"]["avg@k"] <= hi else "no"
        lines.append(f"| {seed} | {cells(s)} | {cells(builtin.get(seed))} | {inside} |")
    return "\n".join(lines) + (f"\n\nHeld-out avg@4 on 16 tasks. `compare`'s `seeupo` arm after RL over its {len(spread)} "
                               f"seeds: {lo:.3f} to {hi:.3f}. Records: `results/{name}/`.")


def agent_overhead(name: str) -> str:
    """``agent-overhead``: benchmarks/agent_overhead.py's rounds from ``results/NAME/agent_overhead.json``
    (``NAME/FILE``: from ``results/NAME/FILE.json``)."""
    import json

    folder, _, file = name.partition("/")
    d = json.loads((RESULTS / folder / f"{file or 'agent_overhead'}.json").read_text())
    pre = "prefilled_agent" in d["rounds_s"][0]
    http = "agent_http" in d["rounds_s"][0]
    lines = ["| round | built-in | agent | agent / built-in | agent: in the sampler | requests per sampler call | "
             "same sampled ids |" + (" pre-filled tokens (built-in / agent) |" if pre else "")
             + (" agent over http | over http / built-in |" if http else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if pre else "") + ("---|---|" if http else "")]
    for i, r in enumerate(d["rounds_s"]):
        lines.append(f"| {i} | {r['built_in']:.2f} s | {r['agent']:.2f} s | {r['agent'] / r['built_in']:.2f}x | "
                     f"{r['agent_in_sampler']:.2f} s | {r['requests_per_batch']:.1f} | {r['identical_episodes']:.0%} |"
                     + (f" {r['prefilled_built_in']} / {r['prefilled_agent']} |" if pre else "")
                     + (f" {r['agent_http']:.2f} s | {r['agent_http'] / r['built_in']:.2f}x |" if http else ""))
    if http:
        return "\n".join(lines) + (f"\n\nMedian agent / built-in: {d['ratio_median']:.2f}x with serve.transport="
                                   f"{d['transport']}, {d['ratio_median_http']:.2f}x over http (`{d['command']}`).")
    return "\n".join(lines) + f"\n\nMedian agent / built-in: {d['ratio_median']:.2f}x (`{d['command']}`)."


def memory_budgets(name: str) -> str:
    """``memory-budgets``: benchmarks/default_update.py --budgets from ``results/NAME/default_update_budgets.json``."""
    import json

    d = json.loads((RESULTS / name / "default_update_budgets.json").read_text())
    lines = ["| `optim.micro_batch_tokens` | update (median of 3) | relative | peak resident memory |",
             "|---|---|---|---|"]
    for b, sec in d["seconds_median"].items():
        lines.append(f"| {b} | {sec:.1f} s | {d['over_first'][b]:.2f}x | {d['peak_rss_gb'][b]:.2f} GB |")
    return "\n".join(lines) + (f"\n\n{d['episodes']} episodes, {d['turn_rows']} turn rows, {d['turn_row_tokens']} tokens, "
                               f"{d['threads']} threads (`{d['command']}`).")


def memory_phases(name: str) -> str:
    """``memory-phases``: benchmarks/memory.py's phases, ``--before`` beside the code as it is, from
    ``results/NAME/memory_before.json`` and ``memory_after.json``."""
    import json

    before = json.loads((RESULTS / name / "memory_before.json").read_text())
    after = json.loads((RESULTS / name / "memory_after.json").read_text())
    rows_b = {r["phase"]: r for r in before["phases"]}

    def gb(r, key):
        return "-" if r is None or key not in r else f"{r[key]:.2f}"

    def sec(r):
        return "-" if r is None or "seconds" not in r else f"{r['seconds']:.0f} s"

    lines = ["| phase | time before | time after | peak before | peak after | at its end before | at its end after | "
             "kept by the allocator after | saved for backward before | saved for backward after |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in after["phases"]:
        b = rows_b.get(r["phase"])
        lines.append(f"| {r['phase']} | {sec(b)} | {sec(r)} | {gb(b, 'peak_gb')} GB | {gb(r, 'peak_gb')} GB | "
                     f"{gb(b, 'end_gb')} GB | "
                     f"{gb(r, 'end_gb')} GB | {gb(r, 'retained_gb')} GB | {gb(b, 'saved_peak_gb')} | "
                     f"{gb(r, 'saved_peak_gb')} |")
    held = after["held"]
    hb = before["held"]
    return "\n".join(lines) + (
        f"\n\nPeak over the phases: {before['peak_gb']:.2f} GB before, {after['peak_gb']:.2f} GB after "
        f"({hb['micro_batch_tokens']}- and {held['micro_batch_tokens']}-token micro-batches, {after['threads']} threads). "
        f"Held throughout: Python with torch and transformers {held['python_torch_gb']:.2f} GB, the weights "
        f"{held['weights_gb']:.2f} GB, the trainable (LoRA) tensors {held['trainable_gb'] * 1000:.1f} MB, the "
        f"optimizer's moments {held['optimizer_gb'] * 1000:.1f} MB"
        + (f", the KL reference {held['kl_reference_gb'] * 1000:.1f} MB" if "kl_reference_gb" in held else "")
        + f"; the sampler's KV caches kept after the rollout {held['sampler_kv_after_rollout_gb']:.2f} GB "
        f"({held['rollout_tokens']} rollout tokens).")


def memory_runs(name: str) -> str:
    """``memory-runs``: the default run under ``/usr/bin/time -v`` (``results/NAME/default-seed-S/``: its
    summary.json and the console with time's report), against `compare_default`'s `seeupo` arm on the same seed."""
    import json

    base = {int(s): v for s, v in next(a for a in results("compare_default")["arms"]
                                       if a["name"] == "seeupo")["per_seed"].items()}
    lines = ["| seed | command | wall | peak resident memory | avg@4 before -> after | gain | the earlier default's "
             "gain (`compare_default`) |", "|---|---|---|---|---|---|---|"]
    gains = []
    for d in sorted((RESULTS / name).glob("default-seed-*"), key=lambda p: int(p.name.rsplit("-", 1)[1])):
        seed = int(d.name.rsplit("-", 1)[1])
        s = json.loads((d / "summary.json").read_text())
        log = (d / "time.log").read_text()
        rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", log).group(1))
        wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", log).group(1)
        cmd = re.search(r'Command being timed: "(.*)"', log).group(1)
        b, a = s["eval_before"]["avg@k"], s["eval_after"]["avg@k"]
        old = base.get(seed)
        gains.append(a - b)
        lines.append(f"| {seed} | `{cmd}` | {wall} | {rss_kb:,} kB ({rss_kb / 2 ** 20:.2f} GiB) | {b:.3f} -> {a:.3f} | "
                     f"{a - b:+.3f} | " + ("-" if old is None else f"{old['after'] - old['before']:+.3f}") + " |")
    spread = [v["after"] - v["before"] for v in base.values()]
    lo, hi = min(spread), max(spread)
    above = sum(g > hi for g in gains)
    inside = sum(lo <= g <= hi for g in gains)
    return "\n".join(lines) + (
        f"\n\nHeld-out avg@4 on 32 tasks. The earlier default's gains over its {len(spread)} seeds: {lo:+.3f} to "
        f"{hi:+.3f}; of these {len(gains)} runs, {inside} gain inside that range, {above} above it and "
        f"{len(gains) - inside - above} below it.")


def robustness(name: str, loss_vs: str | None = None) -> str:
    """``robustness_table``'s tables of an experiment's records (``robustness-onecpu``: see
    ``results``), with ``loss_vs``'s loss table when given."""
    import json

    rt = _script("robustness_table")
    res = json.loads(json.dumps(results(name)))
    return rt.tables(res, rt.report_drawdowns(res), loss_vs=loss_vs).rstrip()


def coverage() -> str:
    cov = _script("coverage")
    return cov.table(cov.coverage(2000), 2000)


def _contrast(name: str, arm: str, base: str) -> dict:
    """Paired ``arm - base`` of an experiment's records, with p_holm across the declared family when the
    pair is in ``PAIRS``, across that experiment's arms against its reference when ``base`` is the
    reference, else across the experiment's contrasts as ``robustness_table`` defines them (each arm
    against its own clean arm)."""
    if (arm, base) in PAIRS.get(name, []):
        return next(c for a, b, c in pair_contrasts(name) if (a, b) == (arm, base))
    res = results(name)
    by = {a["name"]: a for a in res["arms"]}
    if base == res["reference"] and not name.startswith("robustness"):
        a = by[arm]
        return {"diff": a["diff_vs_reference"], "diff_ci95": a["diff_ci95"], "p": a["p"], "p_holm": a["p_holm"],
                "pairs": a["diff_pairs"], "m": len(res["arms"]) - 1}
    rt = _script("robustness_table")
    grid: dict = {}
    for n, a in by.items():
        fam, what, level, algo = rt.parse(n)
        grid.setdefault(fam, {}).setdefault(algo, {})[(what, level)] = a
    tests = rt.contrasts(grid, rt._after)
    fam, what, level, algo = rt.parse(arm)
    key = (fam, algo, what, level)
    if base != f"{key[0]}-clean-{key[1]}":
        raise SystemExit(f"{name}: {arm} is contrasted with its own clean arm, not {base}")
    return {**tests[key], "m": len(tests)}


FINDINGS = [
    # (question, experiment, arm, against)
    ("Natural turn order against reverse (SeeUPO, `lookup`)", "order", "natural", "reverse"),
    ("One joint phase against the reverse schedule (SeeUPO, `lookup`)", "order", "joint", "reverse"),
    ("SeeUPO without its factor against the geometric factor (`lookup`)", "factor", "off", "geometric"),
    ("No advantage normalisation against batch normalisation (SeeUPO)", "norm", "none", "batch"),
    ("Group against batch normalisation (SeeUPO)", "norm", "group", "batch"),
    ("Training only the last turn, against every turn (SeeUPO, `lookup`)", "turns", "seeupo-last1", "seeupo-all"),
    ("GRPO against SeeUPO, every turn trained (`lookup`)", "turns", "grpo-all", "seeupo-all"),
    ("GRPO against SeeUPO, matched schedules (`lookup`)", "compare", "grpo", "seeupo"),
    ("PPO (a critic) against SeeUPO, matched schedules (`lookup`)", "compare", "ppo", "seeupo"),
    ("RLOO (one on-policy step) against SeeUPO (`lookup`)", "compare", "rloo", "seeupo"),
    ("GiGPO against SeeUPO, matched schedules (`lookup`)", "compare_turn", "gigpo", "seeupo"),
    ("SeeUPO fed GiGPO's turn advantages against SeeUPO (`lookup`)", "compare_turn", "seeupo-gigpo", "seeupo"),
    ("GRPO against SeeUPO on the trap family (format-only warm-up)", "compare_trap", "grpo", "seeupo"),
    ("GRPO against SeeUPO on the trap family (partial expert warm-up)", "compare_trap_oracle", "grpo", "seeupo"),
    ("GSPO tuned against its default configuration (`lookup`, equal tuning budget)", "fair", "gspo-tuned",
     "gspo-default"),
    ("GRPO tuned against SeeUPO tuned (`lookup`, equal tuning budget)", "fair", "grpo-tuned", "seeupo-tuned"),
    ("A LoRA adapter per turn against one shared adapter on top (SeeUPO)", "adapters", "seeupo-per_turn",
     "seeupo-lora1"),
    ("A LoRA adapter per turn against one shared adapter on top (GRPO)", "adapters", "grpo-per_turn", "grpo-lora1"),
    ("One bucketed phase against the exact reverse schedule (2-3 turns)", "cost", "seeupo-buckets1", "seeupo-reverse"),
    ("GRPO against the exact reverse schedule (2-3 turns)", "cost", "grpo", "seeupo-reverse"),
    ("A tool that always fails, SeeUPO (`lookup`, one CPU kind)", "robustness-onecpu", "lookup-failure1.0-seeupo",
     "lookup-clean-seeupo"),
    ("Intermediate reward 1.0, GRPO (`lookup`, one CPU kind)", "robustness-onecpu", "lookup-shaping1.0-grpo",
     "lookup-clean-grpo"),
    ("Intermediate reward 1.0, SeeUPO (`lookup`, one CPU kind)", "robustness-onecpu", "lookup-shaping1.0-seeupo",
     "lookup-clean-seeupo"),
    ("Observation noise 1.0, SeeUPO (`lookup`, one CPU kind)", "robustness-onecpu", "lookup-noise1.0-seeupo",
     "lookup-clean-seeupo"),
    ("Intermediate reward 1.0, PPO (`lookup`)", "robustness-onecpu", "lookup-shaping1.0-ppo", "lookup-clean-ppo"),
]


# Declared families of paired contrasts beyond "each arm against the reference": Holm across the family.
PAIRS = {
    # best-of against same-config for each algorithm, then each tuned baseline against tuned SeeUPO
    "fair": [*((f"{a}-tuned", f"{a}-default") for a in ("seeupo", "grpo", "gspo", "ppo")),
             *((f"{a}-tuned", "seeupo-tuned") for a in ("grpo", "gspo", "ppo"))],
    "adapters": [(f"{a}-{arm}", f"{a}-{base}") for a in ("seeupo", "grpo")
                 for arm, base in (("per_turn", "shared"), ("embedding", "shared"), ("lora1", "shared"),
                                   ("per_turn", "lora1"))],
}


def _reading(c: dict) -> str:
    """The word a table may print for a contrast: a declared primary's verdict ("higher", "lower",
    "equivalent", "inconclusive"), else "exploratory"."""
    return c["verdict"] if c.get("verdict") in VERDICT_WORDS else "exploratory"


VERDICT_WORDS = ("higher", "lower", "equivalent", "inconclusive")


def pair_contrasts(name: str) -> list[tuple[str, str, dict]]:
    """``PAIRS[name]``'s paired differences (over the seeds both arms have) with p_holm across them."""
    from seeupo.sweep.stats import holm

    rt = _script("robustness_table")
    by = {a["name"]: a for a in results(name)["arms"]}
    out = [(arm, base, rt.paired_diff(rt._after(by[arm]), rt._after(by[base]))) for arm, base in PAIRS[name]]
    for (_, _, c), ph in zip(out, holm([c["p"] for _, _, c in out])):
        c["p_holm"], c["m"] = ph, len(out)
    return out


def pairs_table(name: str) -> str:
    lines = ["| contrast | difference [95% CI] | pairs | p | reading |",
             "|---|---|---|---|---|"]
    for arm, base, c in pair_contrasts(name):
        lines.append(f"| `{arm}` - `{base}` | {c['diff']:+.3f} {_ci(c['diff_ci95'])} | {c['pairs']} | {_p(c['p'])} | "
                     f"{_reading(c)} |")
    return "\n".join(lines) + (f"\n\nExploratory: these {len(PAIRS[name])} contrasts were not declared before the "
                               "trials ran, so none carries a verdict (p unadjusted).")


def findings_rows() -> list[tuple[str, str, dict]]:
    return [(q, name, _contrast(name, arm, base)) for q, name, arm, base in FINDINGS]


def findings_plot(path: Path) -> Path:
    """The exploratory estimates as a forest plot: each paired difference with its t interval (open
    markers: none carries a verdict)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = findings_rows()
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.2))
    for y, (q, name, c) in enumerate(reversed(rows)):
        lo, hi = c["diff_ci95"]
        ax.plot([lo, hi], [y, y], color="gray", lw=2)
        ax.plot([c["diff"]], [y], "o", color="white", markeredgecolor="black")
    ax.axvline(0, color="gray", lw=0.8, ls="--")
    ax.set_yticks(range(len(rows)), [re.sub(r"`", "", q) for q, _, _ in reversed(rows)], fontsize=7)
    ax.set_xlabel("paired difference in held-out avg@4 (t 95% interval); exploratory estimates, no verdicts", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def estimates() -> str:
    """The questions the experiments before issue 58 asked, as exploratory estimates (none declared a
    primary contrast before its trials ran, so none carries a verdict)."""
    lines = ["| question | experiment | difference [95% CI] | pairs | p | reading |", "|---|---|---|---|---|---|"]
    for q, name, c in findings_rows():
        lines.append(f"| {q} | `{name}` | {c['diff']:+.3f} {_ci(c['diff_ci95'])} | {c['pairs']} | {_p(c['p'])} | "
                     "exploratory |")
    return "\n".join(lines)


def declared() -> list[str]:
    """The shipped experiments that declare primary contrasts."""
    from seeupo.sweep.experiment import experiments, load_experiment

    return [n for n in experiments() if load_experiment(n).primary]


def _recorded(name: str) -> bool:
    return (RESULTS / name).is_dir() and any((RESULTS / name).glob(f"{name}-part-*.tar.xz"))


def findings() -> str:
    """The README's findings: every declared primary contrast with its verdict (from its records), or
    how far its experiment has come."""
    from seeupo.sweep.experiment import load_experiment
    from seeupo.sweep.report import verdict_phrase

    lines = ["| experiment | primary contrast | seeds | difference | interval (level) | p_holm | TOST p_holm | "
             "verdict |", "|---|---|---|---|---|---|---|---|"]
    for name in declared():
        exp = load_experiment(name)
        if not _recorded(name):
            for a, b in exp.primaries():
                lines.append(f"| `{name}` | `{a}` - `{b}` | 0 of {len(exp.seeds)} | - | - | - | - | not run yet |")
            continue
        got = {(c["arm"], c["against"]): c for c in results(name)["primary"]}
        for a, b in exp.primaries():
            c = got.get((a, b))
            if c is None or not c["pairs"]:  # an arm without a finished trial yet
                lines.append(f"| `{name}` | `{a}` - `{b}` | 0 of {len(exp.seeds)} | - | - | - | - | no pair yet |")
                continue
            lines.append(f"| `{name}` | `{a}` - `{b}` | {c['pairs']} of {len(exp.seeds)} | "
                         f"{c['diff']:+.3f} | {_ci(c['ci'])} ({c['ci_level']:.3f}) | {_p(c['p_holm'])} | "
                         f"{_p(c['tost_p_holm'])} | {verdict_phrase(c)}"
                         f"{'' if c['pairs'] == len(exp.seeds) else ' (interim)'} |")
    return "\n".join(lines)


ANSWER_MARGIN = 0.1  # the difference the unanswered experiments' lines size a confirmation for


@functools.lru_cache(maxsize=None)
def seeds_to_answer(name: str) -> tuple[int, int, float, int | None]:
    """For an experiment that declared no primary: (its seeds, its contrasts against the reference m,
    their median paired sd, the seeds a confirmation of all m as primaries would need for 80% power to
    detect ANSWER_MARGIN in one of them, simulated as the plan does; None above 20)."""
    import statistics

    from seeupo.sweep.stats import plan_seeds, sd

    res = results(name)
    others = [a for a in res["arms"] if a["name"] != res["reference"] and a["diff_pairs"] >= 2]
    ref = next(a for a in res["arms"] if a["name"] == res["reference"])
    sds = []
    for a in others:
        d = [a["per_seed"][s]["after"] - ref["per_seed"][s]["after"] for s in a["per_seed"] if s in ref["per_seed"]]
        sds.append(sd(d))
    m = len(others)
    s_ = statistics.median(sds) if sds else float("nan")
    n_seeds = max((a["n"] for a in res["arms"]), default=0)
    # every contrast at the median spread: the family is symmetric, so one primary's plan is all of them'
    need = plan_seeds([s_] * m, ANSWER_MARGIN, cap=20, draws=300, which=[0], equivalence=False)[0]["detect"] if m else None
    return n_seeds, m, s_, need


def unanswered() -> str:
    """One line per experiment with records and no declared primary: exploratory, what it would take."""
    from seeupo.sweep.experiment import experiments

    lines = []
    for name in experiments():
        if name in declared() or not _recorded(name):
            continue
        n, m, s_, need = seeds_to_answer(name)
        if not m:
            lines.append(f"- `{name}` ({n} seeds): one arm, or no paired contrast: descriptive only, no verdict.")
            continue
        took = f"{need} seeds per arm" if need is not None else "more than 20 seeds per arm"
        what = (f"Its contrast as a declared primary, at its paired sd {s_:.3f}," if m == 1 else
                f"Its {m} contrasts as declared primaries, at their median paired sd {s_:.3f},")
        lines.append(f"- `{name}` ({n} seeds, {m} contrast{'s' if m != 1 else ''} against its reference): exploratory, "
                     f"no verdict. {what} would need {took} to detect a difference of {ANSWER_MARGIN}"
                     f"{'' if m == 1 else ' in one'} with 80% power.")
    return "\n".join(lines)


def verdict_sentences(name: str) -> str:
    """A declared experiment's readings, one template per verdict, from its records: each primary,
    then each arm's gain."""
    from seeupo.sweep.experiment import load_experiment

    exp = load_experiment(experiment_path(name))
    if not _recorded(name):
        return f"No trial of `{name}` is recorded yet: no reading (0 of {len(exp.arms) * len(exp.seeds)} trials)."
    res = results(name)
    done = sum(a["n"] for a in res["arms"])
    total = len(exp.arms) * len(exp.seeds)
    head = [] if done == total else [f"Interim: `{name}` {done} of {total} trials in `results/`; the verdicts below are "
                                     "of the seeds recorded so far and final only when every seed has run."]
    return "\n".join(head + verdict_lines(res))


def verdict_lines(res: dict) -> list[str]:
    """The reading of a results.json tree, one template per verdict: each declared primary, then each
    arm's before/after test."""
    from seeupo.sweep.report import gain_words

    out = []
    for c in res["primary"]:
        if not c["pairs"]:
            out.append(f"- `{c['arm']}` - `{c['against']}`: no pair recorded yet.")
            continue
        a, b, n, lo, hi = c["arm"], c["against"], c["pairs"], *c["ci"]
        where = f"over {n} seed{'s' if n != 1 else ''}; p_holm {c['p_holm']:.3f}, TOST p_holm {c['tost_p_holm']:.3f}"
        if lo != lo or hi != hi:  # NaN: one seed gives no interval
            out.append(f"- `{a}` - `{b}`: inconclusive, {c['diff']:+.3f} from one seed, no interval yet ({where}).")
            continue
        if c["verdict"] in ("higher", "lower"):
            extra = f", by less than the margin {c['margin']:g}" if c.get("within_margin") else ""
            out.append(f"- `{a}` is {c['verdict']} than `{b}`{extra}: {c['diff']:+.3f}, interval [{lo:+.3f}, {hi:+.3f}] "
                       f"({where}).")
        elif c["verdict"] == "equivalent":
            out.append(f"- `{a}` and `{b}` are equivalent within +-{c['margin']:g}: {c['diff']:+.3f}, interval "
                       f"[{lo:+.3f}, {hi:+.3f}] ({where}).")
        else:
            out.append(f"- `{a}` - `{b}`: inconclusive, {c['diff']:+.3f}, interval [{lo:+.3f}, {hi:+.3f}]; neither a "
                       f"difference nor equivalence within +-{c['margin']:g} could be declared ({where}).")
    for a in res["arms"]:
        word = gain_words(a["gain_verdict"])
        if word == "inconclusive":
            out.append(f"- `{a['name']}`'s held-out {res['metric']}: {a['before_mean']:.3f} before RL, {a['mean']:.3f} "
                       f"after; the gain {a['gain_mean']:+.3f} is inconclusive (p_holm {a['gain_p_holm']:.3f}).")
        else:
            out.append(f"- `{a['name']}`'s held-out {res['metric']} {word} with RL: {a['before_mean']:.3f} -> "
                       f"{a['mean']:.3f} ({a['gain_mean']:+.3f}, p_holm {a['gain_p_holm']:.3f}).")
    return out


def eval_noise(spec: str) -> str:
    """``eval-noise:FILE``: ``scripts/eval_noise.py``'s repeats (``results/eval_noise/FILE.json``): per
    evaluation the sd of avg@k over sampling seeds on one checkpoint, the same from each repeat's
    per-task outcomes (binomial: sum_g p_g (1 - p_g) / (k - 1) / G^2, averaged), and its share of the
    between-seed variance of the SeeUPO arm's final score in the experiment that used that evaluation
    (``compare_textworld`` for the former, ``confirm_textworld`` for the current one); then the
    cost per trial of both experiments' SeeUPO-family arms from their records."""
    import json
    import statistics

    path = RESULTS / "eval_noise" / f"{spec}.json"
    if not path.exists():
        return f"Not measured yet (`results/eval_noise/{spec}.json` does not exist)."
    data = json.loads(path.read_text())
    between = {"former": "compare_textworld", "current": "confirm_textworld"}
    lines = ["| evaluation | repeats | avg@k mean | sd over repeats | sd from per-task outcomes | between-seed sd "
             "(SeeUPO, its experiment) | noise share of the between-seed variance |", "|---|---|---|---|---|---|---|"]
    for name, runs in data["evaluations"].items():
        xs = [r["avg@k"] for r in runs]
        binom = []
        for r in runs:
            outs = list(r["per_task"].values())
            k = len(outs[0])
            ps = [sum(int(c) for c in o) / k for o in outs]
            binom.append(sum(p * (1 - p) / (k - 1) for p in ps) / len(ps) ** 2)
        sd_rep = statistics.stdev(xs) if len(xs) > 1 else float("nan")
        sd_bin = statistics.mean(binom) ** 0.5
        exp = between[name.split()[0]]
        seeds = ([v["after"] for a in results(exp)["arms"] if a["name"] == "seeupo" for v in a["per_seed"].values()]
                 if _recorded(exp) else [])
        sd_seed = statistics.stdev(seeds) if len(seeds) > 1 else None
        share = "-" if sd_seed is None else f"{sd_rep ** 2 / sd_seed ** 2:.2f} (binomial {sd_bin ** 2 / sd_seed ** 2:.2f})"
        lines.append(f"| {name} | {len(xs)} | {statistics.mean(xs):.3f} | {sd_rep:.4f} | {sd_bin:.4f} | "
                     + ("-" if sd_seed is None else f"{sd_seed:.3f} (`{exp}`, {len(seeds)} seeds)") + f" | {share} |")
    lines += ["", f"One checkpoint (`{data['run']}`, its latest) scored the number of times the repeats column gives, "
              "with run.seed 1000 + r (`python scripts/eval_noise.py RUN --repeats R --out FILE`)."]
    walls = []
    for exp in ("compare_textworld", "confirm_textworld"):
        if not _recorded(exp):
            continue
        for a in results(exp)["arms"]:
            if a["name"] in ("seeupo", "grpo", "gigpo", "seeupo-gigpo"):
                walls.append(f"`{exp}` `{a['name']}` {a['wall_s'] / a['n'] / 60:.1f} min ({a['n']} trials)")
    if walls:
        lines += ["", "Wall time per trial, mean over the recorded trials (one thread each, two trials side by side): "
                  + "; ".join(walls) + "."]
    return "\n".join(lines)


def lab_limits() -> str:
    """``seeupo lab limits``' table from ``results/lab/limits.json``."""
    import json

    from seeupo.lab import limits

    return "\n".join(limits.table_lines(json.loads((RESULTS / "lab" / "limits.json").read_text())))


def lab_turn_rows() -> str:
    """The turn-level algorithms' rows of ``seeupo lab table1`` (multi-turn main rows and the trap
    family) beside GRPO's, PPO's and SeeUPO's, from ``results/lab/table1.json``."""
    import json

    from seeupo.lab import table1

    data = json.loads((RESULTS / "lab" / "table1.json").read_text())
    keep = {"grpo", "ppo", "seeupo", *table1.TURN_ALGOS}
    lines = ["| section | " + " | ".join(c[1] for c in table1.COLUMNS) + " |", "|" + "---|" * (len(table1.COLUMNS) + 1)]
    for section in ("rows", "trap_rows"):
        rows = [r for r in data[section] if r["algorithm"] in keep and r["setting"] == "multi_turn" and not r["variant"]]
        for r in sorted(rows, key=table1.sort_key):
            lines.append(f"| {section} | " + " | ".join(table1.cells(r)) + " |")
    return "\n".join(lines)


def lab_reach_turn() -> str:
    """``seeupo lab reach``' gradient rows with per-turn tables (``lr = 100``) for SeeUPO, GRPO, PPO and the
    turn-level algorithms: the optimal share of the seeds and, in brackets, the seeds with a drop, from
    ``results/lab/reach.json``."""
    import json

    from seeupo.lab import reach

    data = json.loads((RESULTS / "lab" / "reach.json").read_text())
    algos = ["seeupo", "grpo", "mt-grpo", "grpo-togo", "gigpo", "ppo", "turn-ppo"]
    cell = {(r["variant"], r["level"], r["algorithm"]): r for r in data["gradient"] if r["policy"] == "per_turn"}
    lines = ["| break | level | " + " | ".join(algos) + " |", "|---|---|" + "---|" * len(algos)]
    for kind, levels in reach.LEVELS.items():
        for level in levels:
            rs = [cell[(kind, float(level), a)] for a in algos]
            lines.append(f"| {kind} | {level:g} | " + " | ".join(
                f"{r['optimal_rate']:.2f} ({r['seeds_with_drop']})" for r in rs) + " |")
    return "\n".join(lines)


def render(spec: str) -> str:
    kind, _, arg = spec.partition(":")
    if kind == "pairs":
        return pairs_table(arg)
    if kind == "lab-limits":
        return lab_limits()
    if kind == "lab-turn-rows":
        return lab_turn_rows()
    if kind == "lab-reach-turn":
        return lab_reach_turn()
    if kind == "arms":
        return arms_table(arg)
    if kind == "env":
        return env_table(arg)
    if kind == "tuned":
        return tuned_table(arg)
    if kind == "agent-overhead":
        return agent_overhead(arg or "agents")
    if kind == "agents":
        return agents_table(arg or "agents")
    if kind == "memory-budgets":
        return memory_budgets(arg or "memory")
    if kind == "memory-phases":
        return memory_phases(arg or "memory")
    if kind == "memory-runs":
        return memory_runs(arg or "memory")
    if kind == "seeds":
        return seeds_table(arg)
    if kind == "provenance":
        return provenance_table(arg)
    if kind == "turns":
        return turns_table(arg)
    if kind == "robustness":
        return robustness("robustness")
    if kind == "robustness-onecpu":
        return robustness("robustness-onecpu")
    if kind == "robustness-of":  # robustness-of:EXPERIMENT[:LOSS_VS_ALGO]
        name, _, base = arg.partition(":")
        return robustness(name, base or None)
    if kind == "coverage":
        return coverage()
    if kind == "findings":
        return findings()
    if kind == "estimates":
        return estimates()
    if kind == "unanswered":
        return unanswered()
    if kind == "verdicts":
        return verdict_sentences(arg)
    if kind == "eval-noise":
        return eval_noise(arg)
    raise SystemExit(f"unknown generated block kind {kind!r} ({spec})")


def blocks(files=FILES):
    for path in files:
        text = path.read_text()
        for m in BLOCK.finditer(text):
            yield path, m


# Three-decimal figures a reading quotes from elsewhere: (file name, the arms block the reading
# follows, the figure) -> another generated block of that file that must hold it ("claims:SPEC"), or
# why the figure comes from no record.
QUOTED_ELSEWHERE = {
    ("experiments.md", "arms:compare_turn", "0.621"): "claims:arms:compare",
    ("experiments.md", "arms:compare_turn", "0.809"): "claims:arms:compare",
    ("experiments.md", "arms:order", "0.473"): "natural order's mean in notebook.md, on trials since lost",
    ("experiments.md", "arms:compare_default", "0.247"): "SeeUPO's mean in notebook.md, on trials since lost",
    ("experiments.md", "arms:compare_default", "0.299"): "GRPO's mean in notebook.md, on trials since lost",
    ("experiments.md", "arms:compare_default", "0.263"): "GSPO's mean in notebook.md, on trials since lost",
    ("envs.md", "arms:bfcl_default", "0.002"): "the GPU preset's KL coefficient, a setting",
}
FIGURE = re.compile(r"(?<![\d.])([+-]?\d\.\d{3})(?!\d|\.\d)")


def _figures(*bodies: str) -> set[str]:
    held = {f for body in bodies for f in FIGURE.findall(body)}
    return held | {f.lstrip("+-") for f in held}


def prose_figures(files=FILES) -> list[tuple[str, str, str]]:
    r"""The figures a reading quotes that its tables do not give.

    A reading is the prose after a ``claims:arms`` block up to the next heading. Each three-decimal
    figure in it must appear in that block or in a generated block inside the reading (a per-turn
    table), a signed figure with its sign (``+0.031``, a difference) and an unsigned one either way;
    a figure quoted from another experiment must be listed in ``QUOTED_ELSEWHERE`` with the block
    that holds it. The blocks are checked against the records, so a figure copied wrong, or left
    behind when a block changed, is caught here.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "x.md").write_text("<!-- claims:arms:e -->\n| a | 0.600 | +0.031 |\n<!-- /claims:arms:e -->\n"
    ...                             "A ends at 0.600, +0.031 above B and -0.031 below C at 0.631.\n### next\n0.999\n")
    >>> prose_figures([d / "x.md"])
    [('x.md', 'arms:e', '-0.031'), ('x.md', 'arms:e', '0.631')]
    """
    missing = []
    for path in files:
        text = path.read_text()
        found = list(BLOCK.finditer(text))
        specs = {m["spec"]: m["body"] for m in found}
        for m in found:
            if not m["spec"].startswith("arms:"):
                continue
            rest = text[m.end():]
            stop = re.search(r"^#", rest, re.M)
            reading = rest[:stop.start()] if stop else rest
            held = _figures(m["body"], *(b["body"] for b in BLOCK.finditer(reading)))
            for f in FIGURE.findall(BLOCK.sub("", reading)):
                source = QUOTED_ELSEWHERE.get((path.name, m["spec"], f), "")
                if source.startswith("claims:"):
                    ok = f in _figures(specs.get(source[len("claims:"):], ""))
                else:
                    ok = f in held or bool(source)
                if not ok:
                    missing.append((path.name, m["spec"], f))
    return missing


# The hand-written prose held to the verdict rule (the lab's pages state exact expectations; notebook.md
# and performance.md are dated measurements and timings, not comparisons of trained arms)
PROSE = [ROOT / "README.md", *(ROOT / "docs" / f for f in ("experiments.md", "train.md", "core.md", "envs.md"))]
DIRECTIONAL = re.compile(
    r"\b(higher|lower|beats?|beaten|gains?|gained|lose|loses|lost|costs?|raises?|raised|helps?|helped|hurts?|"
    r"better|worse|differs?|differed|within|learns?|learned|changes?|changed|carr(?:y|ies) over|outperforms?|"
    r"improves?|improved|degrades?|degraded|above|below|ahead|behind|leads?|lags?|detected|detectably)\b", re.I)
NAMED = re.compile(r"\b(SeeUPO|GRPO|GSPO|PPO|RLOO|REINFORCE|GiGPO|MT-GRPO|Turn-PPO|HGPO|every algorithm|each algorithm|"
                   r"every method|no method|no algorithm|all algorithms|every arm|each arm)\b|`[a-z][a-z0-9_.-]*`|"
                   r"^\W*Reading:")  # a sentence that opens a reading is about the experiment's arms
# Hand-written sentences the rule lets stand, each with why it states no comparison of trained arms
# (a mechanism, a definition, a setting): (file name, a fragment of the sentence) -> why.
MECHANISMS: dict[tuple[str, str], str] = {
    ("experiments.md", "the verdict is **higher** / **lower** where `p_holm < 0.05`"):
        "the definition of the verdict words themselves",
    ("experiments.md", "The rule for every sentence here and in the README: a directional word"):
        "states this rule, listing the words it forbids",
    ("core.md", "Turn-Level Advantage Estimation with PPO for Improved Multi-Turn RL"):
        "the title of the Turn-PPO paper, cited",
}


def _sentences(text: str) -> list[str]:
    """The hand-written sentences of a markdown text: generated blocks, code, tables, headings and HTML
    comments left out; paragraphs joined; split after . ; : ! ? before a capital, a backtick or a
    bracket."""
    text = BLOCK.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    keep = [line for line in text.splitlines() if not line.lstrip().startswith(("|", "#", "!["))]
    out = []
    for para in "\n".join(keep).split("\n\n"):
        para = " ".join(para.split())
        out += [x for x in re.split(r"(?<=[.;:!?])\s+(?=[A-Z(`*\[-])", para) if x]
    return out


def directional(files=PROSE) -> list[tuple[str, str]]:
    r"""Hand-written sentences that put a directional word next to a named arm or algorithm: the words a
    verdict may use (higher, lower, gains, within, ...), which only ``claims.py``'s generated readings
    may write, from a primary's verdict or a gain's test. Returns ``(file name, sentence)``; a sentence
    in ``MECHANISMS`` (a mechanism, a definition) is let stand.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "x.md").write_text("GRPO ends higher than SeeUPO. The factor is a product of ratios.\n"
    ...                             "<!-- claims:x -->\nGRPO is higher.\n<!-- /claims:x -->\n")
    >>> directional([d / "x.md"])
    [('x.md', 'GRPO ends higher than SeeUPO.')]
    """
    found = []
    for path in files:
        for sent in _sentences(path.read_text()):
            if DIRECTIONAL.search(re.sub(r"`[^`]*`", "", sent)) and NAMED.search(sent):  # words in code spans are names
                if not any(name == path.name and frag in sent for name, frag in MECHANISMS):
                    found.append((path.name, sent))
    return found


COUNT = re.compile(r"`(?P<name>\w+)`,? (?:(?P<n>\d+) of (?P<m>\d+) trials in `results/`"
                   r"|complete \((?P<cn>\d+) of (?P<cm>\d+))")


def trial_counts(files=FILES) -> list[tuple[str, str, str, str]]:
    r"""Where prose states how far an experiment's records have come (``\`NAME\` 44 of 55 trials in
    \`results/\``, ``\`NAME\` complete (10 of 10``), the count it gives against the records'.

    Returns ``(file name, experiment, said, records)`` for each statement whose count of recorded
    trials, or planned total (arms x seeds of the experiment), differs from what results/NAME holds.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "x.md").write_text("`compare` 3 of 40 trials in `results/`, `compare` complete (40 of 40, below)")
    >>> trial_counts([d / "x.md"])  # compare's records hold all of its trials
    [('x.md', 'compare', '3 of 40', '40 of 40')]
    """
    from seeupo.sweep.experiment import load_experiment

    wrong = []
    for path in files:
        for m in COUNT.finditer(path.read_text()):
            name = m["name"]
            said = f"{m['n'] or m['cn']} of {m['m'] or m['cm']}"
            exp = load_experiment(experiment_path(name))
            planned = len(exp.arms) * len(exp.seeds)
            recorded = sum(a["n"] for a in results(name)["arms"]) if (RESULTS / name).is_dir() else 0
            if said != f"{recorded} of {planned}":
                wrong.append((path.name, name, said, f"{recorded} of {planned}"))
    return wrong


def run(write: bool, files=FILES) -> int:
    stale = 0
    for path in files:
        text = path.read_text()

        def sub(m):
            nonlocal stale
            with contextlib.redirect_stdout(io.StringIO()):
                body = render(m["spec"]).rstrip("\n") + "\n"
            if body != m["body"]:
                stale += 1
                if not write:
                    diff = difflib.unified_diff(m["body"].splitlines(), body.splitlines(), "published", "records",
                                                lineterm="", n=0)
                    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                    print(f"{where}: block claims:{m['spec']} differs from its records:")
                    print("\n".join(list(diff)[:40]))
            return m.group(1) + body + m.group(4)

        new = BLOCK.sub(sub, text)
        if write and new != text:
            path.write_text(new)
    if write:
        findings_plot(ROOT / "docs" / "img" / "findings.png")
    n = sum(1 for _ in blocks(files))
    print(f"{n} generated blocks, {stale} {'rewritten' if write else 'stale'}")
    quoted = prose_figures(files)
    for name, spec, f in quoted:
        print(f"{name}: the reading after claims:{spec} quotes {f}, which no generated block gives")
    counts = trial_counts(files)
    for name, exp, said, recorded in counts:
        print(f"{name}: says `{exp}` has {said} trials; results/{exp} holds {recorded}")
    worded = directional([f for f in PROSE if f in files or f.name in {x.name for x in files}])
    for name, sent in worded:
        print(f"{name}: a directional word beside a named arm, with no verdict behind it: {sent[:300]}")
    return 0 if write or not (stale or quoted or counts or worded) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help="rewrite every generated block from the records")
    g.add_argument("--check", action="store_true", help="exit 1 where a block differs from its records")
    a = ap.parse_args(argv)
    return run(write=a.write)


if __name__ == "__main__":
    sys.exit(main())
