"""Per-turn analysis of a run (issue 16: where does the gain come from?).

Every iteration's record in ``metrics.jsonl`` holds ``turn: {t: {...}}``: the rows that reached turn
``t``, their success and reward, the mean advantage x factor, SeeUPO's factor (mean, min, max) and
turn ratio, and the phase's clip fraction, KL and entropy. ``turn_summary`` compares each turn's
early iterations (the first third of the run) with its late ones (the last third), and says when
each turn's success and advantage moved (``half_rise``: the first iteration at which the trailing
3-iteration mean has gone half the way from the early mean to the late one), so turns can be ranked
by which moved first; ``turn_plot`` draws the curves; ``seeupo report RUN_DIR`` writes both, and
sweep reports add the summary per arm (half-rise pooled over seeds as the median of the seeds in
which the turn moved, with their count).
"""

from __future__ import annotations

import math
from pathlib import Path

KEYS = ("success", "reward", "rows", "adv_x_factor_mean", "factor_mean", "factor_min", "factor_max", "ratio_mean",
        "clipfrac", "kl", "entropy")


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else float("nan")


def training_records(records: list[dict]) -> list[dict]:
    return [r for r in records if "reward_mean" in r]


# half-rise: a turn "moved" when its late mean differs from its early one by at least this much
MIN_MOVE = {"success": 0.05, "adv_x_factor_mean": 0.01}
WINDOW = 3


def half_rise(points: list[tuple[int, float]], early: float, late: float, min_move: float,
              window: int = WINDOW) -> int | None:
    """The first iteration at which the trailing ``window``-point mean of ``points`` ((iteration,
    value), in order; full windows only, or every point of a shorter series) has gone half the way
    from ``early`` to ``late``; None when the two differ by less than ``min_move`` (the turn did not
    move) or no window gets there."""
    if not (early == early and late == late) or abs(late - early) < min_move:
        return None
    mid, up = (early + late) / 2, late > early
    n_points = sum(1 for _, v in points if v is not None and v == v)
    vals = []
    for it, v in points:
        if v is None or v != v:
            continue
        vals.append(v)
        if len(vals) < min(window, n_points):  # a full window only: one early point is noise, not a rise
            continue
        m = sum(vals[-window:]) / len(vals[-window:])
        if (m >= mid) if up else (m <= mid):
            return it
    return None


def turn_summary(records: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """``{turn: {key: {"early": mean over the first third, "late": mean over the last third}}}``
    over the training iterations (a run of fewer than 3 iterations: early = first, late = last), and
    ``{turn: {"half_rise": {key: iteration or None}}}`` for the keys of ``MIN_MOVE``."""
    recs = training_records(records)
    if not recs:
        return {}
    k = max(1, len(recs) // 3)
    early, late = recs[:k], recs[-k:]
    turns = sorted({t for r in recs for t in r.get("turn", {})}, key=int)
    out = {}
    for t in turns:
        out[t] = {key: {"early": _mean([r["turn"][t].get(key) for r in early if t in r.get("turn", {})]),
                        "late": _mean([r["turn"][t].get(key) for r in late if t in r.get("turn", {})])}
                  for key in KEYS}
        out[t]["half_rise"] = {key: half_rise([(r["iteration"], r["turn"][t].get(key)) for r in recs
                                               if t in r.get("turn", {})],
                                              out[t][key]["early"], out[t][key]["late"], m)
                               for key, m in MIN_MOVE.items()}
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return float("nan") if not n else (xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2)


def pooled_summary(runs: list[list[dict]]) -> dict[str, dict[str, dict[str, float]]]:
    """``turn_summary`` of each run (seed), then the mean over runs of each early and late value, and
    per ``MIN_MOVE`` key the median half-rise over the runs in which the turn moved, with how many
    did (``{"median": ..., "moved": n, "runs": N}``)."""
    sums = [turn_summary(r) for r in runs]
    turns = sorted({t for sm in sums for t in sm}, key=int)
    out = {}
    for t in turns:
        out[t] = {key: {part: _mean([sm[t][key][part] for sm in sums if t in sm]) for part in ("early", "late")}
                  for key in KEYS}
        out[t]["half_rise"] = {}
        for key in MIN_MOVE:
            its = [sm[t]["half_rise"][key] for sm in sums if t in sm and sm[t]["half_rise"][key] is not None]
            out[t]["half_rise"][key] = {"median": _median(its), "moved": len(its),
                                        "runs": sum(t in sm for sm in sums)}
    return out


def summary_markdown(summary: dict, title: str = "") -> list[str]:
    """A table: per turn, early -> late success, reward, advantage x factor, factor range, ratio."""
    if not summary:
        return []

    def f(d, key, fmt="{:.3f}"):
        a, b = d[key]["early"], d[key]["late"]
        return f"{fmt.format(a)} -> {fmt.format(b)}" if a == a and b == b else "n/a"

    def h(d, key):  # one run: the iteration or '-'; pooled: median (moved in n of N runs)
        x = d.get("half_rise", {}).get(key)
        if isinstance(x, dict):
            return f"{x['median']:g} ({x['moved']}/{x['runs']})" if x["moved"] else f"- (0/{x['runs']})"
        return "-" if x is None else str(x)

    lines = [title, ""] if title else []
    lines += ["| turn | rows | success | reward | adv x factor | factor mean | factor min / max (late) | turn ratio | "
              "success half-rise | adv half-rise |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for t, d in summary.items():
        lo, hi = d["factor_min"]["late"], d["factor_max"]["late"]
        rng = f"{lo:.3g} / {hi:.3g}" if lo == lo else "n/a"
        lines.append(f"| {t} | {f(d, 'rows', '{:.1f}')} | {f(d, 'success')} | {f(d, 'reward')} | "
                     f"{f(d, 'adv_x_factor_mean', '{:+.3f}')} | {f(d, 'factor_mean')} | {rng} | {f(d, 'ratio_mean')} | "
                     f"{h(d, 'success')} | {h(d, 'adv_x_factor_mean')} |")
    return lines


def turn_plot(records: list[dict], path: Path, title: str = "") -> Path | None:
    """Per turn over iterations: success, SeeUPO's factor (mean, min-max band), turn ratio, entropy."""
    recs = training_records(records)
    turns = sorted({t for r in recs for t in r.get("turn", {})}, key=int)
    if not turns:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 3.8))
    for t in turns:
        its = [r["iteration"] for r in recs if t in r.get("turn", {})]
        get = lambda key: [r["turn"][t].get(key, float("nan")) for r in recs if t in r.get("turn", {})]  # noqa: E731
        axes[0].plot(its, get("success"), label=f"turn {t}")
        line, = axes[1].plot(its, get("factor_mean"), label=f"turn {t}")
        axes[1].fill_between(its, get("factor_min"), get("factor_max"), alpha=0.15, color=line.get_color())
        axes[2].plot(its, get("ratio_mean"), label=f"turn {t}")
        axes[3].plot(its, get("entropy"), label=f"turn {t}")
    for ax, label in zip(axes, ("success of episodes that reached the turn", "factor (mean, band: min-max)",
                                "turn ratio after its update", "entropy of the turn's phase")):
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_run_report(out: Path) -> list[str]:
    """``seeupo report RUN``: one run's per-turn analysis written as turns.json, turns.md and turns.png;
    returns the lines to show (the table, then what was written)."""
    import json

    from seeupo.errors import UsageError
    from seeupo.train.runlog import dumps, read_metrics

    records = read_metrics(out)
    summary = turn_summary(records)
    if not summary:
        raise UsageError(f"{out}/metrics.jsonl has no training iteration with per-turn records yet")
    (out / "turns.json").write_text(dumps(summary, indent=1) + "\n")
    head = []
    if (out / "summary.json").exists():
        sm = json.loads((out / "summary.json").read_text())
        b, a = sm.get("eval_before") or {}, sm.get("eval_after") or {}
        if b and a:
            head = [f"Held-out avg@{a.get('k')}: {b['avg@k']:.3f} before RL -> {a['avg@k']:.3f} after; pass@"
                    f"{a.get('k')}: {b['pass@k']:.3f} -> {a['pass@k']:.3f}.", ""]
    lines = [f"# Per turn: {out}", "", *head,
             "Training iterations, per turn: the mean over the first third of the run -> over the last third "
             "(rows: episodes that reached the turn; factor: SeeUPO's carried weight; turn ratio: the "
             "turn's ratio after its phase's update; half-rise: the first iteration at which the turn's trailing "
             "3-iteration mean went half the way from its early mean to its late one, '-' where it moved by less "
             "than 0.05 in success or 0.01 in advantage, or no full window got there).", "", *summary_markdown(summary)]
    (out / "turns.md").write_text("\n".join(lines) + "\n")
    plot = turn_plot(records, out / "turns.png", title=str(out))
    return ["\n".join(summary_markdown(summary)),
            f"wrote {out / 'turns.json'}, {out / 'turns.md'}" + (f" and {plot}" if plot else "")]
