"""What ``seeupo sweep`` and ``seeupo report`` do once their flags are parsed: refuse an
underpowered experiment, restore and reuse records, run the sweep with a line per finished trial
(where it stands and the time left), pack finished trials every ``RECORDS_EVERY_S`` and at the end,
and write the report. Refusals are ``UsageError``s (the command line prints them and exits 2)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rich.table import Table

from seeupo.errors import UsageError
from seeupo.sweep import records as recs
from seeupo.sweep.engine import INTERRUPTED, finished_trials, pace, sweep
from seeupo.sweep.study import SweepSpec

RECORDS_EVERY_S = 1800  # --records: how often finished trials are packed while the sweep runs


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def refuse_underpowered(exp, quick: bool, experiment: str) -> None:
    need = exp.underpowered(quick)
    if need is not None:
        raise UsageError(
            f"experiment {exp.name}: its {len(exp.primaries())} primary contrast(s) cannot reach p_holm < 0.05 at "
            f"{len(exp.plan(quick)[0])} seeds (the exact test's smallest p is 2 / 2^n); it needs at least {need} "
            f"seeds, and more for power: seeupo sweep {experiment} --plan --pilot RECORDS. --allow-underpowered runs "
            "it anyway (a pilot, whose contrasts are then exploratory)")


def take_records(spec: SweepSpec, records: Path | None, reuse: list[Path], say) -> None:
    """Restore this experiment's records into the sweep folder and take reusable trials from other
    experiments' records, saying what each gave."""
    if records is not None:
        try:
            got = recs.restore(spec, records)
        except ValueError as e:
            raise UsageError(str(e)) from e
        say(f"records {records}: {got['restored']} finished trial(s) restored, {got['present']} already here"
            + (f", {got['tuning']} tuning trial(s) added to their studies" if got["tuning"] else "")
            + (f", {got['stale']} skipped (their arm is defined differently now)" if got["stale"] else ""))
    for other in reuse:
        if not other.is_dir():
            raise UsageError(f"--reuse-records {other}: no such folder")
        try:
            taken = recs.reuse(spec, other)
        except ValueError as e:
            raise UsageError(str(e)) from e
        say(f"records {other}: " + ("; ".join(f"{arm} <- {len(t)} trial(s) ({', '.join(t)})"
                                             for arm, t in taken.items()) or "no trial to reuse"))


class Pacer:
    """The sweep's ``on_trial``: a line per ended trial with where the grid stands and the time left at
    this run's pace, and the records packed every ``RECORDS_EVERY_S`` (``save``, also at the end)."""

    def __init__(self, spec: SweepSpec, total: int, say, warn, every: float = RECORDS_EVERY_S):
        self.spec, self.total, self.say, self.warn, self.every = spec, total, say, warn, every
        self.ended, self.before, self.took = 0, finished_trials(spec), []  # took: this run's finished grid trials
        self.saved = time.monotonic()

    def save(self) -> None:
        self.saved = time.monotonic()
        records = self.spec.records
        try:
            if records is not None and (part := recs.save(self.spec, records)):
                self.say(f"records: finished trials packed into {part}")
        except (ValueError, OSError) as e:  # the sweep itself goes on; its trials stay in OUT
            self.warn(f"records: could not pack into {records}: {e}")

    def __call__(self, arm: str, seed, value, seconds: float) -> None:
        self.ended += 1
        what = ("[failed: see its train.log]" if value is None else "[stopped from outside: queued again]"
                if value == INTERRUPTED else f"{self.spec.exp.metric} {value:.3f}")
        where = f"{self.ended} this run"
        if not arm.startswith("tune:"):  # a grid trial: where the sweep stands, and the time left at this pace
            if value is not None and value != INTERRUPTED:
                self.took.append(seconds)
            where = pace(self.before + len(self.took), self.total, self.took, self.spec.workers) + f"; {where}"
        self.say(f"[progress] trial {arm}/seed-{seed}: {what} ({seconds:.0f} s); {where}")
        if time.monotonic() - self.saved > self.every:
            self.save()


def run(spec: SweepSpec, experiment: str, reuse: list[Path], say, warn) -> int:
    """The whole sweep: records taken, trials run, records packed, report written; the exit status
    (0 every trial finished, 1 some given up or missing, 130 interrupted)."""
    exp, quick, out = spec.exp, spec.quick, spec.out
    out.mkdir(parents=True, exist_ok=True)
    meta = {"experiment": exp.model_dump(), "quick": quick,
            "command": " ".join(["seeupo sweep", experiment, "--out", str(out), *(["--quick"] if quick else [])])}
    (out / "sweep.json").write_text(json.dumps(meta, indent=1))
    take_records(spec, spec.records, reuse, say)
    seeds, fixed = exp.plan(quick)
    budget, tune_seeds, tuned = exp.tune_plan(quick)
    n_arms = len(fixed) + len(tuned)  # quick.arms may run a subset of the fixed arms
    tuning = (f"; first {budget} tuning trials x {len(tune_seeds)} seed(s) for each of {', '.join(tuned)}"
              if tuned else "")
    say(f"seeupo sweep {exp.name}{' (quick)' if quick else ''}: {n_arms} arms x {len(seeds)} seeds = "
        f"{n_arms * len(seeds)} trials{tuning}, {spec.workers} worker(s) x {spec.trial_threads} thread(s); "
        f"study {spec.url}")
    start, total = time.perf_counter(), n_arms * len(seeds)
    pacer = Pacer(spec, total, say, warn)
    try:
        counts = sweep(spec, on_trial=pacer)
    except KeyboardInterrupt:
        pacer.save()
        warn(f"interrupted; run the same command again to continue ({out})")
        return 130
    pacer.save()
    say(f"{counts['done']}/{total} trials finished ({counts['given_up']} given up after "
        f"{spec.max_retries} retries) in {time.perf_counter() - start:.0f} s")
    return 1 if counts["given_up"] or counts["done"] < total else 0


def report(out: Path, show) -> None:
    """``seeupo report OUT``: a sweep folder's results.json, report.md and plots, or one run folder's
    per-turn analysis; ``show(renderable)`` prints a line or a table."""
    from seeupo.sweep.experiment import Experiment
    from seeupo.sweep.report import results, verdict_phrase, write
    from seeupo.sweep.turns import write_run_report

    meta_path = out / "sweep.json"
    if not meta_path.exists() and (out / "metrics.jsonl").exists():
        for line in write_run_report(out):
            show(line)
        return
    if not meta_path.exists():
        raise UsageError(f"{out} is neither a sweep folder (no sweep.json) nor a run folder (no metrics.jsonl); "
                         "give the --out of a `seeupo sweep` or a `seeupo train`")
    meta = json.loads(meta_path.read_text())
    exp = meta["experiment"]
    declared = Experiment(**exp)
    res = results(out, experiment=exp["name"], metric=exp["metric"], reference=exp["reference"],
                  arms_order=[*exp["arms"], *((exp.get("tune") or {}).get("arms") or {})],
                  primary=declared.primaries(), margin=declared.margin)
    paths = write(out, res, title=f"{exp['name']}{' (quick)' if meta['quick'] else ''}: {exp['description']}",
                  command=meta["command"])
    show(arms_table(res, exp))
    for c in res["primary"]:
        show(f"primary {c['contrast']}: {c['diff']:+.3f} over {c['pairs']} seeds, p_holm {c['p_holm']:.3f}, "
             f"TOST p_holm {c['tost_p_holm']:.3f}: {verdict_phrase(c)}")
    if not res["primary"]:
        show("no primary contrast declared: every difference above is exploratory (an estimate, no verdict)")
    show(f"wrote {paths['json']}, {paths['md']} and {len(paths) - 2} plot(s)")


def arms_table(res: dict, exp: dict) -> Table:
    t = Table(title=f"{exp['name']}: held-out {exp['metric']} after RL (t 95% CI over seeds; paired difference; "
                    "p_holm (Holm across the declared primaries) only for a primary, every other difference exploratory)")
    for c in ("arm", "seeds", "mean", "95% CI", "gain", f"diff vs {exp['reference']}", "95% CI", "p_holm", "collapses",
              "drawdown"):
        t.add_column(c)
    for a in res["arms"]:
        dd = a.get("drawdown_mean", float("nan"))
        t.add_row(a["name"], str(a["n"]), f"{a['mean']:.3f}", f"[{a['ci95'][0]:.3f}, {a['ci95'][1]:.3f}]",
                  f"{a['gain_mean']:+.3f}", f"{a['diff_vs_reference']:+.3f}",
                  f"[{a['diff_ci95'][0]:+.3f}, {a['diff_ci95'][1]:+.3f}]",
                  "-" if a.get("p_holm") is None or a["p_holm"] != a["p_holm"] else f"{a['p_holm']:.3f}", str(a["collapses"]),
                  "n/a" if dd != dd else f"{dd:.3f}")
    return t


def plan(exp, pilot: Path | None, quick: bool) -> list[str]:
    """``seeupo sweep NAME --plan``: the seeds each primary needs, simulated from the pilot's spread."""
    from seeupo.sweep.planning import pilot_spreads, plan_table

    if not exp.primaries():
        raise UsageError(f"experiment {exp.name} declares no primary contrasts: nothing to plan (it is exploratory as a whole)")
    if pilot is None:
        raise UsageError("--plan needs --pilot RECORDS: the records (or sweep folder) of an earlier experiment holding "
                         "the primaries' arms, whose paired differences give the spread")
    try:
        spreads = pilot_spreads(exp, pilot)
    except ValueError as e:
        raise UsageError(str(e)) from e
    return plan_table(exp, spreads, quick=quick)
