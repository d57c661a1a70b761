"""The paper's Table 1 as a measurement: which estimator/update pairs improve monotonically and
reach the optimum, single-turn and multi-turn, exactly and by sampling.

``seeupo lab table1 --out DIR`` writes ``table1.json``, ``table1.md`` and ``table1.png``. Sections:

- ``rows`` (the contract): clearly separated random instances, one step size for every algorithm.
- ``matched_rows``: the same instances with step sizes matched (``RunConfig.match_step``).
- ``trap_rows``: the trap family of ``problems.trap_problem`` (a reward table per seed) at a
  moderate and a large step.
- ``trap_ablation``: the trap family at the large step: SeeUPO's factor variants (full, geometric,
  clamped, off) beside baselines matched to SeeUPO in normalisation and optimizer steps.
- ``shared_ablation``: the same variants and matched baselines with parameters shared across turns.
- ``step_rows``: multi-turn exact runs at a small and a large step size.
- ``norm_rows``: GSPO and SeeUPO with each advantage normalisation, multi-turn sampled.

Every row reports, besides the share of iterations whose exact expected return fell, the number of
seeds with any fall and the largest fall (a rate alone hides rare large drops).

The lab's schedule: PPU methods take ``LAB_EPOCHS`` full-batch steps per phase (SeeUPO: one phase
per turn, so ``T x LAB_EPOCHS`` steps; joint methods one phase), REINFORCE and RLOO one; each clip
range is the algorithm's declared one (GSPO: 3e-4 / 4e-4). The *matched* baselines take
``minibatches="turns"`` (as many steps as SeeUPO) and SeeUPO's batch normalisation.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from seeupo.core.algorithms import get_algorithm
from seeupo.core.estimators import names
from seeupo.lab.problems import TreeShape, broken_trap_problem, iid_problem, separated_problem, trap_problem
from seeupo.lab.runner import RunConfig, run, schedule

ALGOS = ("ppo", "grpo", "gspo", "rloo", "reinforce", "seeupo", "seeupo-natural", "seeupo-random")
# turn-level credit (issue 34): multi-turn rows and the trap family only (with one turn GiGPO, MT-GRPO and
# reward-to-go are GRPO with a rescaled step, and Turn-PPO is PPO with a sequence-level clip)
TURN_ALGOS = ("gigpo", "mt-grpo", "grpo-togo", "turn-ppo")
SHAPES = {"single_turn": TreeShape(turns=1, tokens_per_turn=2, vocab=3),
          "multi_turn": TreeShape(turns=3, tokens_per_turn=2, vocab=2)}
N_TASKS = 4
BASE_LR = 10.0
OPTIMAL_TOL = 0.01  # final gap below 1% of the reward range
DROP_TOL = 1e-9
LAB_EPOCHS = 4  # full-batch steps per phase of the PPU methods
CLAMP = (0.8, 1.2)  # the authors' clamp of each factor weight and of the product
# (algorithm, label, RunConfig fields): SeeUPO's factor variants and baselines matched to SeeUPO
VARIANTS = [
    ("seeupo", "factor=geometric", {"factor_ratio": "geometric"}),
    ("seeupo", "factor=full", {"factor_ratio": "full"}),
    ("seeupo", "factor=clamped", {"factor_ratio": "geometric", "factor_clip": CLAMP}),
    ("seeupo", "factor=off", {"factor_ratio": "off"}),
    ("seeupo", "norm=none", {"norm": "none"}),
    ("grpo", "matched", {"minibatches": "turns", "norm": "batch"}),
    ("gspo", "matched", {"minibatches": "turns", "norm": "batch"}),
    ("gspo", "matched, norm=none", {"minibatches": "turns", "norm": "none"}),
    ("reinforce", "norm=batch", {"norm": "batch"}),
]


@dataclass(frozen=True)
class Job:
    section: str
    problem: str  # "separated" | "trap"
    setting: str
    mode: str
    policy: str
    algorithm: str
    cfg: RunConfig
    seeds: tuple[int, ...]
    variant: str = ""  # what differs from the algorithm's lab defaults (VARIANTS), "" for none


def lab_config(algo: str, **fields) -> RunConfig:
    """The lab's schedule for ``algo`` (``LAB_EPOCHS`` steps per phase for PPU methods)."""
    epochs = 1 if get_algorithm(algo).loss == "reinforce" else LAB_EPOCHS
    return RunConfig(**{"epochs": epochs, "minibatches": 1, **fields})


def _variant_jobs(section, problem, mode, policy, lr, base, seed_list, variants=VARIANTS) -> list[Job]:
    return [Job(section, problem, "multi_turn", mode, policy, algo, replace(base[algo], lr=lr, **fields),
                seed_list, label) for algo, label, fields in variants]


def plan(*, quick: bool, seeds: int | None = None) -> list[Job]:
    n = seeds or (5 if quick else 20)
    seed_list = tuple(range(n))
    base = {a: lab_config(a, iterations=120 if quick else 400, lr=BASE_LR) for a in ALGOS + TURN_ALGOS}
    jobs = []
    for algo in TURN_ALGOS:
        for mode in ("exact", "sampled"):
            for policy in ("per_turn", "shared"):
                jobs.append(Job("rows", "separated", "multi_turn", mode, policy, algo, base[algo], seed_list))
            for lr in (BASE_LR, 10 * BASE_LR):
                jobs.append(Job("trap_rows", "trap", "multi_turn", mode, "per_turn", algo,
                                replace(base[algo], lr=lr), seed_list))
    for algo in ALGOS:
        for setting, mode, policy in [
            ("single_turn", "exact", "per_turn"), ("single_turn", "sampled", "per_turn"),
            ("multi_turn", "exact", "per_turn"), ("multi_turn", "sampled", "per_turn"),
            ("multi_turn", "exact", "shared"), ("multi_turn", "sampled", "shared"),
        ]:
            jobs.append(Job("rows", "separated", setting, mode, policy, algo, base[algo], seed_list))
        for setting in SHAPES:
            jobs.append(Job("matched_rows", "separated", setting, "exact", "per_turn", algo,
                            replace(base[algo], match_step=True), seed_list))
        for lr in (BASE_LR, 10 * BASE_LR):
            for mode in ("exact", "sampled"):
                jobs.append(Job("trap_rows", "trap", "multi_turn", mode, "per_turn", algo,
                                replace(base[algo], lr=lr), seed_list))
        for lr in (BASE_LR / 10, 10 * BASE_LR):
            jobs.append(Job("step_rows", "separated", "multi_turn", "exact", "per_turn", algo,
                            replace(base[algo], lr=lr), seed_list))
    for algo in ("gspo", "seeupo"):
        for norm in ("none", "group", "batch"):
            jobs.append(Job("norm_rows", "separated", "multi_turn", "sampled", "per_turn", algo,
                            replace(base[algo], norm=norm), seed_list))
    for mode in ("exact", "sampled"):
        jobs += _variant_jobs("trap_ablation", "trap", mode, "per_turn", 10 * BASE_LR, base, seed_list)
    jobs += _variant_jobs("shared_ablation", "separated", "exact", "shared", BASE_LR, base, seed_list)
    small = [v for v in VARIANTS if v[1] in ("norm=none", "matched, norm=none")] + [("reinforce", "", {})]
    jobs += _variant_jobs("shared_ablation", "separated", "exact", "shared", BASE_LR / 10, base, seed_list, small)
    return jobs


def run_job(job: Job) -> tuple[dict, list[float]]:
    """Run one job; return its table row and the mean normalised-gap curve (for the plot)."""
    torch.set_num_threads(1)
    problem = make_problem(job)
    algo = get_algorithm(job.algorithm)
    res = run(problem, algo, mode=job.mode, policy=job.policy, cfg=job.cfg, seed=17)
    gap = (problem.optimum.unsqueeze(-1) - res.returns) / problem.reward_range.unsqueeze(-1)
    final = gap[:, -1]
    fall = -res.returns.diff(dim=-1) / problem.reward_range.unsqueeze(-1)  # [S, iterations], > 0: a drop
    drops = fall > DROP_TOL
    row = {
        "algorithm": job.algorithm,
        "variant": job.variant,
        "setting": job.setting,
        "mode": job.mode,
        "policy": job.policy,
        "seeds": len(job.seeds),
        "optimal_rate": float((final < OPTIMAL_TOL).double().mean()),
        "mean_final_gap": float(final.mean()),
        "monotonic_violation_rate": float(drops.double().mean()),
        "seeds_with_drop": int(drops.any(-1).sum()),
        "max_drop": float(fall.max()) if bool(drops.any()) else 0.0,
        "median_iterations_to_optimal": _median_first(gap < OPTIMAL_TOL),
        "mean_initial_gap": float(gap[:, 0].mean()),
        "problem": job.problem,
        "lr": res.lr,
        "epochs": res.schedule["epochs"],
        "minibatches": res.schedule["minibatches"],
        "clip_eps": res.schedule["clip_eps"],
        "clip_eps_high": res.schedule["clip_eps_high"],
        "factor": (job.cfg.factor_ratio + ("+clamp" if job.cfg.factor_clip else "")
                   if algo.sequential else "-"),
        "steps_per_iteration": res.steps_per_iteration,
        "iterations": job.cfg.iterations,
        "norm": algo.estimator if algo.estimator in names("critic") else job.cfg.norm or algo.norm,
        "clipfrac_mean": res.diagnostics["clipfrac_mean"],
        "clipfrac_first_tenth": res.diagnostics["clipfrac_first_tenth"],
        "step": job.cfg.step,
        "step_size": (job.cfg.beta if job.cfg.step == "kl" else job.cfg.step_clip if job.cfg.step == "clip"
                      else res.lr),
        "advantage": job.cfg.advantage,
    }
    return row, gap.mean(0).tolist()


def make_problem(job: Job):
    """The job's problem instances: ``separated``, ``trap``, ``trap-KIND@LEVEL`` (a broken trap,
    ``problems.broken_trap_problem``) or ``iid:T,L,V`` (i.i.d. rewards, 2 tasks per instance)."""
    seeds = list(job.seeds)
    if job.problem == "trap":
        return trap_problem(seeds)
    if job.problem.startswith("trap-"):
        kind, level = job.problem[len("trap-"):].split("@")
        return broken_trap_problem(seeds, kind, float(level))
    if job.problem.startswith("iid:"):
        T, L, V = (int(x) for x in job.problem[len("iid:"):].split(","))
        return iid_problem(TreeShape(turns=T, tokens_per_turn=L, vocab=V), 2, [5000 + s for s in seeds])
    return separated_problem(SHAPES[job.setting], N_TASKS, [1000 + s for s in seeds])


def _median_first(reached_SI: torch.Tensor) -> float | None:
    """Median over the seeds that end at the optimum of the first iteration from which they stay
    there; None if none does."""
    ok = reached_SI[:, -1]
    if not bool(ok.any()):
        return None
    # the first index after the last miss
    misses = (~reached_SI[ok]).int()
    idx = torch.arange(reached_SI.shape[1])
    first = ((misses * (idx + 1)).max(-1).values).double()
    return float(first.median())


def measure(jobs: list[Job], *, workers: int | None = None, progress=None) -> list[tuple[Job, dict, list[float]]]:
    workers = workers or max(1, min(2, os.cpu_count() or 1))
    out = []
    if workers == 1:
        for job in jobs:
            out.append((job, *run_job(job)))
            if progress:
                progress()
        return out
    # longest jobs first, so that no worker is left alone with a long job at the end
    order = sorted(range(len(jobs)), key=lambda i: -_cost(jobs[i]))
    done = {}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for i, (row, curve) in zip(order, pool.map(run_job, [jobs[i] for i in order], chunksize=1)):
            done[i] = (jobs[i], row, curve)
            if progress:
                progress()
    return [done[i] for i in range(len(jobs))]


def _cost(job: Job) -> float:
    """A rough relative cost of a job: trajectories x optimizer steps per iteration x iterations."""
    shape = make_problem(replace(job, seeds=(0,))).shape
    algo = get_algorithm(job.algorithm)
    sched = schedule(algo, job.cfg)
    phases = shape.turns if (job.cfg.order or algo.order) != "joint" else 1
    steps = phases * sched.epochs * sched.steps_per_pass(shape.turns)
    return shape.n_traj * (steps + 2) * job.cfg.iterations * (2 if job.policy == "shared" else 1)


def assemble(results) -> dict:
    table: dict = {s: [] for s in SECTIONS}
    table["curves"] = {}
    for job, row, curve in results:
        table[job.section].append(row)
        key = (f"{job.section}|{job.problem}|{job.setting}|{job.mode}|{job.policy}|lr={row['lr']:g}"
               f"|{row['norm']}|{job.algorithm}|{job.variant}")
        table["curves"][key] = curve
    table["config"] = {
        "shapes": {k: asdict(v) for k, v in SHAPES.items()}, "tasks_per_instance": N_TASKS,
        "base_lr": BASE_LR, "optimal_tolerance": OPTIMAL_TOL, "drop_tolerance": DROP_TOL,
        "lab_epochs": LAB_EPOCHS,
        "variants": [[a, label, {f: list(v) if isinstance(v, tuple) else v for f, v in kw.items()}]
                     for a, label, kw in VARIANTS],
        "run_config": asdict(results[0][0].cfg) if results else {},
    }
    return table


SECTIONS = {
    "rows": "Main table: separated random instances, one step size for all",
    "matched_rows": "Control: step sizes matched (lr x L / steps per phase for length-normalised PPU losses)",
    "trap_rows": "Trap family (T=2, a reward table per seed), moderate and large steps",
    "trap_ablation": "Trap family, large step: SeeUPO's factor variants and baselines matched to SeeUPO",
    "shared_ablation": "Parameters shared across turns (exact): factor variants, matched baselines, small steps",
    "step_rows": "Multi-turn exact, small and large steps",
    "norm_rows": "Advantage normalisation, multi-turn sampled",
}
COLUMNS = [("algorithm", "algorithm", "{}"), ("variant", "variant", "{}"), ("setting", "setting", "{}"),
           ("mode", "mode", "{}"), ("policy", "policy", "{}"), ("optimal_rate", "optimal", "{:.2f}"),
           ("mean_final_gap", "final gap", "{:.4f}"), ("monotonic_violation_rate", "drops", "{:.3f}"),
           ("seeds_with_drop", "seeds w/ drop", "{}"), ("max_drop", "max drop", "{:.2g}"),
           ("median_iterations_to_optimal", "iters to opt.", "{:g}"),
           ("lr", "lr", "{:g}"), ("steps_per_iteration", "steps/iter", "{}"), ("norm", "adv", "{}"),
           ("factor", "factor", "{}"), ("clipfrac_first_tenth", "clipfrac (first 10%)", "{:.3f}")]


def cells(row: dict) -> list[str]:
    """A table row's cells, as ``COLUMNS`` formats them."""
    out = []
    for key, _, fmt in COLUMNS:
        v = row.get(key)
        if key == "seeds_with_drop":
            out.append(f"{v}/{row['seeds']}")
        else:
            out.append("-" if v is None else fmt.format(v))
    return out


def sort_key(r: dict):
    return (r["setting"], r["policy"], r["mode"], r["lr"], (ALGOS + TURN_ALGOS).index(r["algorithm"]), r["variant"],
            r["norm"])


def markdown(table: dict) -> str:
    parts = []
    for section, title in SECTIONS.items():
        rows = table.get(section, [])
        if not rows:
            continue
        parts.append(f"### {title}\n")
        parts.append("| " + " | ".join(c[1] for c in COLUMNS) + " |")
        parts.append("|" + "---|" * len(COLUMNS))
        for r in sorted(rows, key=sort_key):
            parts.append("| " + " | ".join(cells(r)) + " |")
        parts.append("")
    seeds = table["rows"][0]["seeds"] if table["rows"] else 0
    head = (f"# Table 1, measured\n\n{seeds} seeds per row. optimal: share of seeds whose final gap "
            f"to the optimum is below {OPTIMAL_TOL:.0%} of the reward range; final gap: mean of that gap; "
            "drops: share of iterations whose exact expected return fell by more than 1e-9 of the reward range; "
            "seeds w/ drop: "
            "seeds with at least one such fall; max drop: the largest fall in one iteration, as a share of "
            "the reward range; iters to opt.: median, over the seeds that end at the optimum, of the "
            "iteration from which they stay there; factor: SeeUPO's turn weight (full, geometric, +clamp: "
            "each weight and the "
            "product in [0.8, 1.2], off: no factor); clipfrac: share of clipped rows or tokens over the "
            "first tenth of the iterations.\n\n")
    return head + "\n".join(parts)


def plot(table: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("rows", "separated", "single_turn", "per_turn", BASE_LR, "single turn"),
              ("rows", "separated", "multi_turn", "per_turn", BASE_LR, "multi turn, per-turn tables"),
              ("rows", "separated", "multi_turn", "shared", BASE_LR, "multi turn, shared table"),
              ("trap_rows", "trap", "multi_turn", "per_turn", 10 * BASE_LR, "trap instances, large step")]
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 7), sharey=True)
    colors = dict(zip(ALGOS + TURN_ALGOS, plt.cm.tab20.colors[::2] + plt.cm.tab20.colors[1::2]))
    for i, mode in enumerate(("exact", "sampled")):
        for j, (section, problem, setting, policy, lr, title) in enumerate(panels):
            ax = axes[i][j]
            for algo in ALGOS + TURN_ALGOS:
                a = get_algorithm(algo)
                norm = a.estimator if a.estimator in names("critic") else a.norm
                key = f"{section}|{problem}|{setting}|{mode}|{policy}|lr={lr:g}|{norm}|{algo}|"
                if key in table["curves"]:
                    curve = [max(g, 1e-6) for g in table["curves"][key]]
                    style = "--" if algo.startswith("seeupo-") else ":" if algo in TURN_ALGOS else "-"
                    ax.plot(curve, style, color=colors[algo], label=algo, lw=1.4)
            ax.set_yscale("log")
            ax.set_title(f"{title} ({mode})", fontsize=9)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel("gap to optimum / reward range")
            if i == 1:
                ax.set_xlabel("iteration")
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.suptitle("Exact expected return during training (mean over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(table: dict, out: Path) -> dict[str, Path]:
    return write_outputs(table, out, "table1", markdown, plot)


def write_outputs(table: dict, out: Path, stem: str, to_markdown, to_plot) -> dict[str, Path]:
    """``out/STEM.json`` (replaced atomically), ``STEM.md`` and ``STEM.png`` of a lab table."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "md": out / f"{stem}.md", "png": out / f"{stem}.png"}
    tmp = paths["json"].with_suffix(".json.tmp")
    tmp.write_text(json.dumps(table, indent=1))
    tmp.replace(paths["json"])
    paths["md"].write_text(to_markdown(table))
    to_plot(table, paths["png"])
    return paths
