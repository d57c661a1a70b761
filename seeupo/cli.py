"""The ``seeupo`` command line: ``seeupo train``, ``seeupo lab table1``."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="seeupo: multi-turn agent RL for LLMs (SeeUPO and its backbones).")
lab_app = typer.Typer(add_completion=False, no_args_is_help=True,
                      help="The tabular convergence lab (exact expectations, no neural models).")
app.add_typer(lab_app, name="lab")
console = Console(width=None if sys.stdout.isatty() else 160)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=False)


@lab_app.command("table1")
def lab_table1(
    out: Path = typer.Option(Path("runs/table1"), "--out", help="Folder for table1.json, table1.md, table1.png."),
    quick: bool = typer.Option(False, "--quick", help="5 seeds x 150 iterations (under a minute on 2 cores)."),
    seeds: Optional[int] = typer.Option(None, "--seeds", min=1, help="Seeds per row (default 5 quick, 20 full)."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes (default: up to 2)."),
) -> None:
    """Measure the paper's Table 1: monotonic improvement and convergence of every algorithm."""
    from seeupo.lab import table1

    jobs = table1.plan(quick=quick, seeds=seeds)
    start = time.perf_counter()
    with _progress() as bar:
        task = bar.add_task(f"table1 ({len(jobs)} runs)", total=len(jobs))
        results = table1.measure(jobs, workers=workers, progress=lambda: bar.advance(task))
    table = table1.assemble(results)
    paths = table1.write(table, out)
    _print_rows(table["rows"], "Table 1 (main rows)")
    console.print(f"[bold]{len(jobs)} runs in {time.perf_counter() - start:.1f} s[/]; "
                  f"wrote {paths['json']}, {paths['md']}, {paths['png']}")


def _print_rows(rows: list[dict], title: str) -> None:
    from seeupo.lab.table1 import ALGOS, COLUMNS

    t = Table(title=title)
    for _, name, _ in COLUMNS:
        t.add_column(name)
    for r in sorted(rows, key=lambda r: (r["setting"], r["policy"], r["mode"], ALGOS.index(r["algorithm"]))):
        t.add_row(*[fmt.format(r[k]) for k, _, fmt in COLUMNS])
    console.print(t)


def _build_config(preset, overrides, *, algo=None, model=None, env=None, out=None, steps=None, seed=None,
                  resume=False):
    from seeupo.train.config import ConfigError, load_config

    extra: dict = {}
    for key, value in (("algo.name", algo), ("model.name", model), ("env.name", env), ("run.out", out),
                       ("run.iterations", steps), ("run.seed", seed)):
        if value is not None:
            extra[key] = value
    if resume:
        if out is None:
            raise typer.BadParameter("--resume needs --out DIR (the run folder to continue)")
        saved = Path(out) / "config.yaml"
        if not saved.exists():
            raise typer.BadParameter(f"--resume: {saved} does not exist")
        preset = str(saved)
    try:
        return load_config(preset, [*(f"{k}={v}" for k, v in extra.items()), *(overrides or [])])
    except ConfigError as e:
        console.print(f"[red]{e}[/]")
        raise typer.Exit(2)


@app.command(context_settings={"allow_extra_args": False})
def train(
    overrides: Optional[list[str]] = typer.Argument(None, help="config overrides, e.g. algo.name=grpo rollout.group_size=8"),
    preset: str = typer.Option("default", "--preset", help="preset name (default, tiny, authors_code) or a YAML path"),
    algo: Optional[str] = typer.Option(None, "--algo", help="seeupo, ppo, grpo, gspo, rloo, reinforce, ..."),
    model: Optional[str] = typer.Option(None, "--model", help="model short name, local folder or HF name"),
    env: Optional[str] = typer.Option(None, "--env", help="environment name"),
    out: Optional[str] = typer.Option(None, "--out", help="run folder (default from the preset)"),
    steps: Optional[int] = typer.Option(None, "--steps", min=0, help="RL iterations"),
    seed: Optional[int] = typer.Option(None, "--seed", help="run seed"),
    resume: bool = typer.Option(False, "--resume", help="continue the run in --out from its latest checkpoint"),
) -> None:
    """Train an LLM agent with RL (SeeUPO by default) and evaluate it before and after."""
    from seeupo.train.trainer import Trainer

    cfg = _build_config(preset, overrides, algo=algo, model=model, env=env, out=out, steps=steps, seed=seed,
                        resume=resume)
    console.print(f"[bold]seeupo train[/]: {cfg.algo.name} | model {cfg.model.name} | env {cfg.env.name} | "
                  f"{cfg.run.iterations} iterations of {cfg.rollout.tasks_per_iteration}x{cfg.rollout.group_size} "
                  f"episodes | out {cfg.run.out}")
    with _progress() as bar:
        trainer = Trainer(cfg, resume=resume, console=console, bar=bar)
        task = bar.add_task("RL", total=cfg.run.iterations)

        def on_iteration(done, record):
            bar.update(task, completed=done, description=(
                f"RL  reward {record['reward_mean']:.3f}  success {record['success_rate']:.2f}"))

        summary = trainer.run(progress=on_iteration)
    b, a = summary["eval_before"], summary["eval_after"]
    console.print(f"[bold]done[/] in {summary['wall_seconds']:.0f} s: avg@{a['k']} {b['avg@k']:.3f} -> "
                  f"{a['avg@k']:.3f}, pass@{a['k']} {b['pass@k']:.3f} -> {a['pass@k']:.3f} on {a['tasks']} "
                  f"held-out tasks; wrote {cfg.run.out}/summary.json, metrics.jsonl, curves.png")


@app.command("eval")
def evaluate(
    overrides: Optional[list[str]] = typer.Argument(None, help="config overrides"),
    preset: str = typer.Option("default", "--preset", help="preset name or YAML path"),
    model: Optional[str] = typer.Option(None, "--model", help="model short name, local folder or HF name"),
    checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint", help="a run folder: evaluate its latest checkpoint"),
    env: Optional[str] = typer.Option(None, "--env", help="environment name"),
    split: str = typer.Option("test", "--split", help="task split"),
    k: int = typer.Option(4, "--k", min=1, help="samples per task"),
    max_tasks: Optional[int] = typer.Option(None, "--max-tasks", min=1, help="evaluate the first N tasks"),
    policy: str = typer.Option("model", "--policy", help="model | oracle (scripted reference answers)"),
    out: Optional[str] = typer.Option(None, "--out", help="write DIR/eval.json"),
) -> None:
    """avg@k and pass@k of a model, a checkpoint or the oracle on a task split."""
    import json as _json

    from seeupo.train import checkpoint as ckpt
    from seeupo.train.trainer import Trainer, oracle_policy

    if policy not in ("model", "oracle"):
        raise typer.BadParameter("--policy must be model or oracle")
    if checkpoint_dir:
        preset = str(Path(checkpoint_dir) / "config.yaml")
    cfg = _build_config(preset, [*(overrides or []), f"eval.split={split}", f"eval.k={k}", "warmup.enabled=off",
                                 *([f"eval.tasks={max_tasks}"] if max_tasks else ["eval.tasks=1000000"])],
                        model=model, env=env)
    bar = _progress()
    bar.start()
    trainer = Trainer(cfg, console=console, bar=bar)
    if checkpoint_dir:
        path = ckpt.latest(Path(checkpoint_dir))
        if path is None:
            console.print(f"[red]no checkpoint under {checkpoint_dir}/checkpoints[/]")
            raise typer.Exit(2)
        ckpt.load(path, trainer.named_params, None)
        console.print(f"loaded {path}")
    pol = oracle_policy(trainer.chat) if policy == "oracle" else None
    start = time.perf_counter()
    try:
        res = trainer.evaluate(policy=pol, tag="eval-cli")
    finally:
        bar.stop()
    data = {**res.as_dict(), "split": split, "env": cfg.env.name, "policy": policy,
            "model": cfg.model.name, "seconds": time.perf_counter() - start}
    console.print(f"{cfg.env.name}/{split}: avg@{k} {res.avg:.3f}  pass@{k} {res.passk:.3f}  "
                  f"({res.tasks} tasks, {data['seconds']:.0f} s)")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "eval.json").write_text(_json.dumps(data, indent=1))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
