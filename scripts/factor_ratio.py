"""SeeUPO's factor weight, full vs geometric (vs clamped vs off), on the lab's trap family.

    python scripts/factor_ratio.py            # 20 trap instances, exact and sampled, L = 2 and 3 (75 s, 1 core)

For each response length L (tokens per turn), step size and variant: how many of the 20 instances
end at the optimum (final gap under 1% of the reward range) after 150 iterations, and, in exact mode,
after 10 / 20 / 30 / 65 iterations. SeeUPO's lab schedule (4 full-batch steps per phase). The
result and the choice of default it informed are in docs/core.md.
"""
import torch

from seeupo.core.algorithms import get_algorithm
from seeupo.lab.problems import trap_problem
from seeupo.lab.runner import RunConfig, run

VARIANTS = [("full", None), ("geometric", None), ("geometric", (0.8, 1.2)), ("off", None)]


def main() -> None:
    torch.set_num_threads(1)
    seeds = list(range(20))
    print("| L | mode | lr | variant | optimal at 10 / 20 / 30 / 65 / 150 iterations |")
    print("|---|---|---|---|---|")
    for L in (2, 3):
        problem = trap_problem(seeds, L)
        for mode in ("exact", "sampled"):
            for lr in (10.0, 30.0, 100.0):
                for ratio, clip in VARIANTS:
                    cfg = RunConfig(iterations=150, lr=lr, epochs=4, minibatches=1, factor_ratio=ratio, factor_clip=clip)
                    res = run(problem, get_algorithm("seeupo"), mode=mode, policy="per_turn", cfg=cfg, seed=17)
                    gap = (problem.optimum.unsqueeze(-1) - res.returns) / problem.reward_range.unsqueeze(-1)
                    ok = gap < 0.01
                    at = " / ".join(str(int(ok[:, k].sum())) for k in (10, 20, 30, 65, 150))
                    name = ratio + ("+clamp" if clip else "")
                    print(f"| {L} | {mode} | {lr:g} | {name} | {at} (of {len(seeds)}) |", flush=True)


if __name__ == "__main__":
    main()
