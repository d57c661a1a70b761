"""The ``seeupo`` command line: ``train``, ``eval``, ``sample``, ``summarize``, ``sweep``, ``report``,
``setup``, ``lab table1``, ``lab reach`` and ``lab limits`` (``seeupo --help`` lists them with what each does)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from seeupo.progress import progress_display

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="seeupo: multi-turn agent RL for LLMs (SeeUPO and its backbones).")
lab_app = typer.Typer(add_completion=False, no_args_is_help=True,
                      help="The tabular convergence lab (exact expectations, no neural models).")
app.add_typer(lab_app, name="lab")
# under torchrun / accelerate launch only the first process prints
_QUIET = int(os.environ.get("RANK", "0")) != 0
console = Console(width=None if sys.stdout.isatty() else 160, quiet=_QUIET)
# errors: one line on stderr, never wrapped, never read as markup (a message may hold "[0.9,")
err_console = Console(stderr=True, soft_wrap=True, highlight=False, quiet=_QUIET)


def fail(message: str, code: int = 2):
    """Print ``error: message`` on one line and exit with ``code`` (2: bad input, the fix in the message)."""
    err_console.print(f"error: {message}", style="red", markup=False)
    raise typer.Exit(code)


def _progress():
    return progress_display(console, quiet=_QUIET)


@lab_app.command("table1")
def lab_table1(
    out: Path = typer.Option(Path("runs/table1"), "--out", help="Folder for table1.json, table1.md, table1.png."),
    quick: bool = typer.Option(False, "--quick", help="5 seeds x 120 iterations (under a minute on 2 cores)."),
    seeds: Optional[int] = typer.Option(None, "--seeds", min=1, help="Seeds per row (default 5 quick, 20 full)."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes (default: up to 2)."),
) -> None:
    """Measure the paper's Table 1: monotonic improvement and convergence of every algorithm."""
    from seeupo.lab import table1

    table, done = _lab(table1, "table1", quick, seeds, workers, out)
    _print_rows(table["rows"], "Table 1 (main rows)")
    done()


@lab_app.command("reach")
def lab_reach(
    out: Path = typer.Option(Path("runs/reach"), "--out", help="Folder for reach.json, reach.md, reach.png."),
    quick: bool = typer.Option(False, "--quick", help="5 seeds x 60 iterations, 40 search instances per shape."),
    seeds: Optional[int] = typer.Option(None, "--seeds", min=1, help="Seeds per row (default 5 quick, 20 full)."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes (default: up to 2)."),
) -> None:
    """How far the guarantees reach: trap instances with the bandit view broken (a stochastic tool, a
    noisy observation, intermediate rewards, variable length), gradient steps beside each phase's
    surrogate solved exactly, and a search for a drop under the exact step (docs/lab.md)."""
    from seeupo.lab import reach

    table, done = _lab(reach, "reach", quick, seeds, workers, out)
    found = [r for r in table["search"] if r["seeds_with_drop"]]
    console.print(f"search: {len(table['search'])} rows, {len(found)} with a drop under the exact step")
    done()


@lab_app.command("limits")
def lab_limits(
    out: Path = typer.Option(Path("runs/limits"), "--out", help="Folder for limits.json, limits.md, limits.png."),
    quick: bool = typer.Option(False, "--quick", help="5 seeds x 60 iterations."),
    seeds: Optional[int] = typer.Option(None, "--seeds", min=1, help="Seeds per row (default 5 quick, 20 full)."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes (default: up to 2)."),
) -> None:
    """The two limits on one axis: PPO and Turn-PPO with a critic of growing error (noise, bias) beside
    SeeUPO, GRPO and GiGPO with the bandit view broken by degrees, on the trap family: the
    share of seeds that improve monotonically and that reach the optimum (docs/lab.md)."""
    from seeupo.lab import limits

    table, done = _lab(limits, "limits", quick, seeds, workers, out)
    console.print(limits.markdown(table))
    done()


def _lab(mod, name: str, quick: bool, seeds, workers, out: Path):
    """Plan, measure (with a progress bar), assemble and write one lab table; returns the table and
    a function that prints the closing line (runs, seconds, files)."""
    jobs = mod.plan(quick=quick, seeds=seeds)
    start = time.perf_counter()
    with _progress() as bar:
        task = bar.add_task(f"{name} ({len(jobs)} runs)", total=len(jobs))
        results = mod.measure(jobs, workers=workers, progress=lambda: bar.advance(task))
    table = mod.assemble(results)
    paths = mod.write(table, out)
    seconds = time.perf_counter() - start

    def done():
        console.print(f"[bold]{len(jobs)} runs in {seconds:.1f} s[/]; wrote {paths['json']}, {paths['md']}, {paths['png']}")
    return table, done


def _print_rows(rows: list[dict], title: str) -> None:
    from seeupo.lab.table1 import COLUMNS, cells, sort_key

    t = Table(title=title)
    for _, name, _ in COLUMNS:
        t.add_column(name)
    for r in sorted(rows, key=sort_key):
        t.add_row(*cells(r))
    console.print(t)


def _build_config(preset, overrides, *, algo=None, model=None, env=None, out=None, steps=None, seed=None,
                  resume=False, agent=None):
    from seeupo.train.config import ConfigError, load_config

    extra: dict = {}
    for key, value in (("algo.name", algo), ("model.name", model), ("env.name", env), ("run.out", out),
                       ("run.iterations", steps), ("run.seed", seed), ("rollout.agent", agent)):
        if value is not None:
            extra[key] = value
    if resume:
        if out is None:
            fail("--resume needs --out DIR (the folder of the run to continue)")
        saved = Path(out) / "config.yaml"
        if not saved.exists():
            fail(f"--resume: {out} holds no run (no config.yaml); start one there without --resume")
        preset = str(saved)
    try:
        return load_config(preset, [*(f"{k}={v}" for k, v in extra.items()), *(overrides or [])])
    except ConfigError as e:
        fail(str(e))


def _run_config(folder: str, overrides=None):
    """The config of the run in ``folder`` (its config.yaml), with ``run.out`` pointing at that
    folder wherever the command runs; exits 2 with the fix when it is not a run folder."""
    saved = Path(folder) / "config.yaml"
    if not saved.exists():
        fail(f"{folder} is not a run folder (no config.yaml); give the --out folder of a `seeupo train` run")
    return _build_config(str(saved), [*(overrides or []), f"run.out={folder}"])


def _preflight(cfg) -> None:
    """The checks that need no model: the environment and its options, the device, whether the
    model can be found offline. Exits 2 with one line naming the fix."""
    from seeupo.train.stack import InputError, check_inputs

    try:
        check_inputs(cfg)
    except InputError as e:
        fail(str(e))


def _build(kind: str, cfg, **kw):
    """A training run (`kind="trainer"`: model, sampler, environment, optimizer and state) or the policy
    alone (`"stack"`: what scoring, serving or sampling a model needs); bad input exits with code 2."""
    from seeupo.train.stack import InputError, PolicyStack
    from seeupo.train.trainer import Trainer

    try:
        return Trainer(cfg, console=console, **kw) if kind == "trainer" else PolicyStack(cfg, **kw)
    except InputError as e:
        fail(str(e))


@app.command(context_settings={"allow_extra_args": False})
def train(
    overrides: Optional[list[str]] = typer.Argument(None, help="config overrides, e.g. algo.name=grpo rollout.group_size=8"),
    preset: str = typer.Option("default", "--preset", help="preset name (default, tiny, textworld, authors_code, bfcl_gpu) or a YAML path"),
    algo: Optional[str] = typer.Option(None, "--algo", help="seeupo, ppo, grpo, gspo, rloo, reinforce, gigpo, mt-grpo, grpo-togo, turn-ppo, ..."),
    model: Optional[str] = typer.Option(None, "--model", help="model short name, local folder or HF name"),
    env: Optional[str] = typer.Option(None, "--env", help="environment name"),
    out: Optional[str] = typer.Option(None, "--out", help="run folder (default from the preset)"),
    steps: Optional[int] = typer.Option(None, "--steps", min=0, help="RL iterations"),
    seed: Optional[int] = typer.Option(None, "--seed", help="run seed"),
    resume: bool = typer.Option(False, "--resume", help="continue the run in --out from its latest checkpoint"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace the run already in --out (its files only)"),
    agent: Optional[str] = typer.Option(None, "--agent", help="an agent program as the rollout source, FILE.py:FUNCTION "
                                        "or module:function (async def f(task, client) -> reward; docs/agents.md)"),
) -> None:
    """Train an LLM agent with RL (SeeUPO by default) and evaluate it before and after.

    A folder that holds a run is never overwritten silently: --resume continues it, --overwrite replaces it. SIGTERM / Ctrl-C stop at the next safe point with a checkpoint (a second Ctrl-C exits at once). Exit codes: 0 done, 1 stopped by non-finite steps (run.max_nonfinite), 2 bad input, 128+signal when interrupted (docs/reliability.md).

    Several processes: torchrun --nproc_per_node N -m seeupo train ... or accelerate launch -m seeupo train ... (parallel.strategy=ddp|fsdp2, run.device=auto|cpu|cuda; docs/scale.md)."""  # noqa: E501 (one line a paragraph: the help wraps it)
    from seeupo.train import checkpoint as ckpt
    from seeupo.train.trainer import NonFiniteStop, RunInterrupted

    if resume and overwrite:
        fail("--resume and --overwrite contradict each other; choose one")
    cfg = _build_config(preset, overrides, algo=algo, model=model, env=env, out=out, steps=steps, seed=seed,
                        resume=resume, agent=agent)
    if not resume and not overwrite and ckpt.holds_run(Path(cfg.run.out)):
        fail(f"{cfg.run.out} already holds a run; continue it with --resume, replace it with --overwrite, "
             "or choose a new --out")
    _preflight(cfg)
    console.print(f"[bold]seeupo train[/]: {cfg.algo.name} | model {cfg.model.name} | env {cfg.env.name} | "
                  f"{cfg.run.iterations} iterations of {cfg.rollout.tasks_per_iteration}x{cfg.rollout.group_size} "
                  f"episodes | out {cfg.run.out}")
    with _progress() as bar:
        try:
            trainer = _build("trainer", cfg, resume=resume, overwrite=overwrite, bar=bar)
        except KeyboardInterrupt:  # before the run's own handler is installed: nothing written yet
            bar.stop()
            err_console.print("interrupted while loading; nothing was written", style="yellow", markup=False)
            raise typer.Exit(130)
        task = None  # added when RL starts (after the warm-up and the evaluation before RL)

        def on_iteration(done, record):
            nonlocal task
            if task is None:
                task = bar.add_task("RL", total=cfg.run.iterations, completed=done)
            if record is not None:
                bar.update(task, completed=done, description=(
                    f"RL  reward {record['reward_mean']:.3f}  success {record['success_rate']:.2f}"))

        try:
            summary = trainer.run(progress=on_iteration)
        except RunInterrupted as e:
            bar.stop()
            err_console.print(str(e), style="yellow", markup=False)
            raise typer.Exit(e.exit_code)
        except NonFiniteStop as e:
            bar.stop()
            fail(str(e), code=1)
        except KeyboardInterrupt:  # a second Ctrl-C: at once, without a checkpoint
            bar.stop()
            err_console.print(f"interrupted at once; the latest checkpoint is kept: seeupo train --resume --out "
                              f"{cfg.run.out}", style="yellow", markup=False)
            raise typer.Exit(130)
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
    policy: str = typer.Option("model", "--policy",
                               help="model | oracle (scripted reference answers) | empty (replies with nothing)"),
    out: Optional[str] = typer.Option(None, "--out", help="write DIR/eval.json"),
) -> None:
    """avg@k and pass@k of a model, a checkpoint or the oracle on a task split."""
    import json as _json

    from seeupo.train import checkpoint as ckpt
    from seeupo.train.evaluation import SCRIPTED_POLICIES, evaluate as evaluate_policy

    if policy != "model" and policy not in SCRIPTED_POLICIES:
        raise typer.BadParameter(f"--policy must be one of: model, {', '.join(SCRIPTED_POLICIES)}")
    extra = [*(overrides or []), f"eval.split={split}", f"eval.k={k}", "warmup.enabled=off",
             *([f"eval.tasks={max_tasks}"] if max_tasks else ["eval.tasks=1000000"])]
    if checkpoint_dir:
        extra += [f"{key}={v}" for key, v in (("model.name", model), ("env.name", env)) if v is not None]
        cfg = _run_config(checkpoint_dir, extra)
        if ckpt.latest(Path(checkpoint_dir)) is None:
            fail(f"no checkpoint under {checkpoint_dir}/checkpoints (the run stopped before its first one); "
                 "evaluate a finished run, or resume this one first")
    else:
        cfg = _build_config(preset, extra, model=model, env=env)
    _preflight(cfg)
    bar = _progress()
    bar.start()
    try:
        stack = _build("stack", cfg)
    except typer.Exit:
        bar.stop()
        raise
    if checkpoint_dir:
        path = ckpt.latest(Path(checkpoint_dir))
        ckpt.load(path, stack.named_params, None)
        console.print(f"loaded {path}")
    pol = SCRIPTED_POLICIES[policy](stack.chat) if policy != "model" else None
    start = time.perf_counter()
    try:
        res = evaluate_policy(stack, policy=pol, tag="eval-cli", detailed=True, bar=bar)
    finally:
        bar.stop()
        stack.close()
    data = {**res.as_dict(), "split": split, "env": cfg.env.name, "policy": policy,
            "model": cfg.model.name, "seconds": time.perf_counter() - start}
    t = Table(title=f"{cfg.env.name} / {split} / policy {policy}")
    for col in ("category", "tasks", f"avg@{k}", f"pass@{k}"):
        t.add_column(col)
    rows = list(res.by_category.items())
    if len(rows) > 1:
        rows.append(("all", {"tasks": res.tasks, "avg@k": res.avg, "pass@k": res.passk}))
    for name, r in rows:
        t.add_row(name, str(r["tasks"]), f"{r['avg@k']:.3f}", f"{r['pass@k']:.3f}")
    console.print(t)
    st = res.stats
    console.print(f"avg@{k} {res.avg:.3f}  pass@{k} {res.passk:.3f}  ({res.tasks} tasks x {k}, "
                  f"{data['seconds']:.0f} s); per episode: {st['episode/turns']:.1f} model calls, tool-call "
                  f"error rate {st['tool/error_rate']:.2f}, ended by context {st['episode/end_context']:.2f}, "
                  f"by max_turns {st['episode/end_max_turns']:.2f}")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "eval.json").write_text(_json.dumps(data, indent=1))


@app.command("serve")
def serve(
    overrides: Optional[list[str]] = typer.Argument(None, help="config overrides (serve.parser=hermes, serve.tool_role=tool, ...)"),
    preset: str = typer.Option("default", "--preset", help="preset name or YAML path"),
    model: Optional[str] = typer.Option(None, "--model", help="model short name, local folder or HF name"),
    checkpoint_dir: Optional[str] = typer.Option(None, "--checkpoint", help="a run folder: serve its latest checkpoint"),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    max_tokens: int = typer.Option(256, "--max-tokens", min=1, help="most tokens in one reply"),
) -> None:
    """Serve a model, or a run's latest checkpoint, as an OpenAI-compatible endpoint: POST /v1/chat/completions (messages, tools, tool_choice, temperature, max_tokens, n, logprobs, seed) and GET /v1/models. Tool calls are parsed from the model's own syntax (serve.parser) into OpenAI tool_calls. Requests that arrive together are batched. docs/agents.md."""  # noqa: E501
    from seeupo.serve.app import serve_forever
    from seeupo.serve.engine import ChatEngine
    from seeupo.train import checkpoint as ckpt

    extra = [*(overrides or []), "warmup.enabled=off", "rollout.agent=null"]  # a run's agent is not served
    if checkpoint_dir:
        cfg = _run_config(checkpoint_dir, extra + ([f"model.name={model}"] if model else []))
        if ckpt.latest(Path(checkpoint_dir)) is None:
            fail(f"no checkpoint under {checkpoint_dir}/checkpoints (the run stopped before its first one)")
    else:
        cfg = _build_config(preset, extra, model=model)
    _preflight(cfg)
    stack = _build("stack", cfg)
    if checkpoint_dir:
        path = ckpt.latest(Path(checkpoint_dir))
        ckpt.load(path, stack.named_params, None)
        console.print(f"loaded {path}")
    engine = ChatEngine(stack.sampler, stack.chat, model_name=cfg.model.name, parser=cfg.serve.parser,
                        tool_role=cfg.serve.tool_role, max_context=cfg.rollout.max_context, max_new_tokens=max_tokens,
                        temperature=None, max_wait_s=cfg.serve.max_wait_ms / 1000)
    console.print(f"serving {cfg.model.name} on http://{host}:{port}/v1 (model name {cfg.model.name!r}; Ctrl-C stops)")
    serve_forever(engine, host, port)


@app.command("sample")
def sample(
    checkpoint_dir: Path = typer.Argument(..., help="a run folder: its latest checkpoint is loaded"),
    n: int = typer.Option(64, "--n", min=1, help="episodes to sample"),
    task_index: int = typer.Option(0, "--task", min=0, help="index of the task in the split"),
    split: str = typer.Option("test", "--split"),
    top: int = typer.Option(12, "--top", min=1, help="most frequent response sequences shown"),
) -> None:
    """Sample episodes of one task from a checkpoint and tally the turn-by-turn responses (what the
    policy actually does, and whether it depends on the turn)."""
    import collections

    from seeupo.data.episode import derive_seed
    from seeupo.rollout.runner import run_episodes
    from seeupo.train import checkpoint as ckpt

    cfg = _run_config(str(checkpoint_dir), ["warmup.enabled=off"])
    path = ckpt.latest(checkpoint_dir)
    if path is None:
        fail(f"no checkpoint under {checkpoint_dir}/checkpoints (the run stopped before its first one)")
    _preflight(cfg)
    stack = _build("stack", cfg)
    ckpt.load(path, stack.named_params, None)
    task = stack.family.tasks(split)[task_index]
    jobs = [(task, 0, s, derive_seed(cfg.run.seed, "sample", s)) for s in range(n)]
    import torch

    with torch.no_grad():
        eps = run_episodes(stack.sampler, stack.chat, stack.family, jobs, stack.limits)
    console.print(f"{path}: task {task.id}, {n} episodes, success {sum(e.score >= cfg.eval.threshold for e in eps) / n:.3f}")
    t = Table(title="most frequent responses, turn by turn")
    t.add_column("count")
    t.add_column("responses")
    for seq, c in collections.Counter(tuple(e.texts) for e in eps).most_common(top):
        t.add_row(str(c), " | ".join(seq))
    console.print(t)


@app.command("summarize")
def summarize(
    runs: list[Path] = typer.Argument(..., help="run folders (each with a summary.json)"),
    out: Optional[Path] = typer.Option(None, "--out", help="also write the table as JSON here"),
) -> None:
    """Before/after held-out avg@k and pass@k of finished runs, per run and per algorithm (mean +- std)."""
    import json as _json
    import statistics

    found = []
    for r in runs:
        f = r / "summary.json"
        if not f.exists():
            console.print(f"[yellow]{r}: no summary.json (unfinished?), skipped[/]")
            continue
        s = _json.loads(f.read_text())
        found.append({"run": str(r), "algorithm": s["algorithm"], "seed": s["seed"], "minutes": s["wall_seconds"] / 60,
                      **{f"{w}_{m}": s[f"eval_{w}"][f"{m}@k"] for w in ("before", "after") for m in ("avg", "pass")},
                      "k": s["eval_after"]["k"], "tasks": s["eval_after"]["tasks"]})
    if not found:
        raise typer.Exit(1)
    t = Table(title="runs")
    for c in ("run", "algorithm", "seed", "min", "avg@k before", "avg@k after", "pass@k before", "pass@k after"):
        t.add_column(c)
    for r in found:
        t.add_row(r["run"], r["algorithm"], str(r["seed"]), f"{r['minutes']:.1f}", f"{r['before_avg']:.3f}",
                  f"{r['after_avg']:.3f}", f"{r['before_pass']:.3f}", f"{r['after_pass']:.3f}")
    console.print(t)
    groups: dict = {}
    for r in found:
        groups.setdefault(r["algorithm"], []).append(r)
    agg = {}
    t = Table(title="per algorithm: mean +- std over seeds")
    for c in ("algorithm", "seeds", "avg@k before", "avg@k after", "pass@k before", "pass@k after"):
        t.add_column(c)
    for algo, rs in groups.items():
        def ms(key):
            xs = [r[key] for r in rs]
            return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)
        agg[algo] = {key: ms(key) for key in ("before_avg", "after_avg", "before_pass", "after_pass")}
        agg[algo]["seeds"] = sorted(r["seed"] for r in rs)
        t.add_row(algo, ",".join(map(str, agg[algo]["seeds"])),
                  *(f"{agg[algo][k][0]:.3f} +- {agg[algo][k][1]:.3f}" for k in ("before_avg", "after_avg",
                                                                               "before_pass", "after_pass")))
    console.print(t)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(_json.dumps({"runs": found, "per_algorithm": agg}, indent=1))


RECORDS_EVERY_S = 1800  # seeupo sweep --records: how often finished trials are packed while the sweep runs


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@app.command("sweep")
def sweep_cmd(
    experiment: str = typer.Argument(..., help="a shipped experiment (configs/experiments/NAME.yaml) or a YAML file"),
    out: Optional[Path] = typer.Option(None, "--out", help="the sweep folder: study.db, trials/ARM/seed-S, results.json, "
                                       "report.md (needed unless --plan)"),
    quick: bool = typer.Option(False, "--quick", help="the experiment's quick mode (fewer seeds, shorter runs)"),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="parallel trial processes (default: CPU cores / --trial-threads)"),
    storage: Optional[str] = typer.Option(None, "--storage", help="Optuna storage URL shared by workers on several machines (default: sqlite:///OUT/study.db)"),
    trial_threads: int = typer.Option(1, "--trial-threads", min=1, help="CPU threads per trial (fixed, so results do not depend on --workers)"),
    max_retries: int = typer.Option(2, "--max-retries", min=0, help="times a failed trial is queued again"),
    heartbeat: int = typer.Option(60, "--heartbeat", min=1, help="seconds between a running trial's heartbeats in "
                                  "the study; a trial silent for 3 of them lost its worker (a machine that died): "
                                  "it is queued again and resumed from its checkpoint"),
    records: Optional[Path] = typer.Option(None, "--records", help="a folder of compressed parts holding finished "
                                           "trials' small files (and tuning trials' with their scores): unpacked into OUT first (those trials "
                                           "are read, not trained), and every trial finished since is packed into a new part every "
                                           "30 minutes and at the end or on interruption; carries a long sweep across "
                                           "machines whose disks do not last"),
    reuse_records: Optional[list[Path]] = typer.Option(None, "--reuse-records", help="another experiment's records "
                                                       "folder: its finished trials of an arm defined exactly as one of "
                                                       "this experiment's (same base and overrides, any arm name) and "
                                                       "of a seed this one runs are taken as that arm's trials, not "
                                                       "trained again; repeatable"),
    plan: bool = typer.Option(False, "--plan", help="train nothing: simulate the primary contrasts (exact test, Holm, "
                              "TOST at the margin, the metric's granularity) from the pilot's paired spread and print "
                              "the seeds each needs for 80%% power to detect the margin and to declare equivalence"),
    pilot: Optional[Path] = typer.Option(None, "--pilot", help="with --plan: a records folder (or a sweep folder) "
                                         "of an earlier experiment with the primaries' arms, whose paired "
                                         "differences give the spread"),
    allow_underpowered: bool = typer.Option(False, "--allow-underpowered", help="run an experiment whose primaries "
                                            "cannot reach p_holm < 0.05 at its seeds (a pilot)"),
) -> None:
    """Run an experiment's trials (every arm x seed, each an ordinary run folder) on an Optuna study,
    then write its report. Re-running skips finished trials, resumes interrupted ones, retries failed
    ones; optuna-dashboard sqlite:///OUT/study.db shows it live (docs/experiments.md)."""
    import json as _json

    from seeupo.sweep import records as recs
    from seeupo.sweep.engine import INTERRUPTED, SweepSpec, finished_trials, pace, sweep
    from seeupo.sweep.experiment import load_experiment
    from seeupo.train.config import ConfigError

    try:
        exp = load_experiment(experiment)
        exp.validate_arms(quick)
    except ConfigError as e:
        fail(str(e))
    if plan:
        _plan(exp, pilot, quick)
        return
    if out is None:
        fail("seeupo sweep: --out DIR is needed (the sweep folder)")
    need = exp.underpowered(quick)
    if need is not None and not allow_underpowered:
        fail(f"experiment {exp.name}: its {len(exp.primaries())} primary contrast(s) cannot reach p_holm < 0.05 at "
             f"{len(exp.plan(quick)[0])} seeds (the exact test's smallest p is 2 / 2^n); it needs at least {need} "
             f"seeds, and more for power: seeupo sweep {experiment} --plan --pilot RECORDS. --allow-underpowered runs "
             "it anyway (a pilot, whose contrasts are then exploratory)")
    workers = workers or max(1, _cores() // trial_threads)
    spec = SweepSpec(exp, out, quick, storage=storage, workers=workers, trial_threads=trial_threads,
                     max_retries=max_retries, heartbeat=heartbeat, records=records)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"experiment": exp.model_dump(), "quick": quick,
            "command": " ".join(["seeupo sweep", experiment, "--out", str(out), *(["--quick"] if quick else [])])}
    (out / "sweep.json").write_text(_json.dumps(meta, indent=1))
    if records is not None:
        try:
            got = recs.restore(spec, records)
        except ValueError as e:
            fail(str(e))
        console.print(f"records {records}: {got['restored']} finished trial(s) restored, {got['present']} already "
                      f"here" + (f", {got['tuning']} tuning trial(s) added to their studies" if got["tuning"] else "")
                      + (f", {got['stale']} skipped (their arm is defined differently now)" if got["stale"] else ""))
    for other in reuse_records or []:
        if not other.is_dir():
            fail(f"--reuse-records {other}: no such folder")
        try:
            taken = recs.reuse(spec, other)
        except ValueError as e:
            fail(str(e))
        console.print(f"records {other}: " + ("; ".join(f"{arm} <- {len(t)} trial(s) ({', '.join(t)})"
                                                         for arm, t in taken.items()) or "no trial to reuse"),
                      markup=False, highlight=False)
    seeds, fixed = exp.plan(quick)
    budget, tune_seeds, tuned = exp.tune_plan(quick)
    n_arms = len(fixed) + len(tuned)  # quick.arms may run a subset of the fixed arms
    tuning = (f"; first {budget} tuning trials x {len(tune_seeds)} seed(s) for each of {', '.join(tuned)}"
              if tuned else "")
    console.print(f"[bold]seeupo sweep[/] {exp.name}{' (quick)' if quick else ''}: {n_arms} arms x {len(seeds)} seeds = "
                  f"{n_arms * len(seeds)} trials{tuning}, {workers} worker(s) x {trial_threads} thread(s); "
                  f"study {spec.url}")
    start = time.perf_counter()
    done = [0]
    total, before, took = n_arms * len(seeds), finished_trials(spec), []  # took: this run's finished grid trials
    saved = [time.monotonic()]

    def save_records():
        saved[0] = time.monotonic()
        try:
            if records is not None and (part := recs.save(spec, records)):
                console.print(f"records: finished trials packed into {part}", markup=False, highlight=False)
        except (ValueError, OSError) as e:  # the sweep itself goes on; its trials stay in OUT
            err_console.print(f"records: could not pack into {records}: {e}", style="yellow", markup=False)

    def on_trial(arm, seed, value, seconds):
        done[0] += 1
        what = ("[failed: see its train.log]" if value is None else "[stopped from outside: queued again]"
                if value == INTERRUPTED else f"{exp.metric} {value:.3f}")
        where = f"{done[0]} this run"
        if not arm.startswith("tune:"):  # a grid trial: where the sweep stands, and the time left at this pace
            if value is not None and value != INTERRUPTED:
                took.append(seconds)
            where = pace(before + len(took), total, took, workers) + f"; {where}"
        console.print(f"[progress] trial {arm}/seed-{seed}: {what} ({seconds:.0f} s); {where}",
                      markup=False, highlight=False)
        if time.monotonic() - saved[0] > RECORDS_EVERY_S:
            save_records()

    try:
        counts = sweep(spec, on_trial=on_trial)
    except KeyboardInterrupt:
        save_records()
        err_console.print(f"interrupted; run the same command again to continue ({out})", style="yellow", markup=False)
        raise typer.Exit(130)
    save_records()
    console.print(f"{counts['done']}/{total} trials finished ({counts['given_up']} given up after "
                  f"{max_retries} retries) in {time.perf_counter() - start:.0f} s")
    _report(out)
    if counts["given_up"] or counts["done"] < total:
        raise typer.Exit(1)


def _run_report(out: Path) -> None:
    """One run's per-turn analysis: turns.json, turns.md, turns.png."""
    import json as _json

    from seeupo.sweep.turns import summary_markdown, turn_plot, turn_summary
    from seeupo.train.runlog import dumps, read_metrics

    records = read_metrics(out)
    summary = turn_summary(records)
    if not summary:
        fail(f"{out}/metrics.jsonl has no training iteration with per-turn records yet")
    (out / "turns.json").write_text(dumps(summary, indent=1) + "\n")
    s = out / "summary.json"
    head = []
    if s.exists():
        sm = _json.loads(s.read_text())
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
    console.print("\n".join(summary_markdown(summary)))
    console.print(f"wrote {out / 'turns.json'}, {out / 'turns.md'}" + (f" and {plot}" if plot else ""))


def _report(out: Path) -> None:
    import json as _json

    from seeupo.sweep.report import results, write

    meta_path = out / "sweep.json"
    if not meta_path.exists() and (out / "metrics.jsonl").exists():
        return _run_report(out)
    if not meta_path.exists():
        fail(f"{out} is neither a sweep folder (no sweep.json) nor a run folder (no metrics.jsonl); give the "
             "--out of a `seeupo sweep` or a `seeupo train`")
    meta = _json.loads(meta_path.read_text())
    exp = meta["experiment"]
    from seeupo.sweep.experiment import Experiment

    declared = Experiment(**exp)
    res = results(out, experiment=exp["name"], metric=exp["metric"], reference=exp["reference"],
                  arms_order=[*exp["arms"], *((exp.get("tune") or {}).get("arms") or {})],
                  primary=declared.primaries(), margin=declared.margin)
    paths = write(out, res, title=f"{exp['name']}{' (quick)' if meta['quick'] else ''}: {exp['description']}",
                  command=meta["command"])
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
    console.print(t)
    from seeupo.sweep.report import verdict_phrase

    for c in res["primary"]:
        console.print(f"primary {c['contrast']}: {c['diff']:+.3f} over {c['pairs']} seeds, p_holm {c['p_holm']:.3f}, "
                      f"TOST p_holm {c['tost_p_holm']:.3f}: [bold]{verdict_phrase(c)}[/]")
    if not res["primary"]:
        console.print("no primary contrast declared: every difference above is exploratory (an estimate, no verdict)")
    console.print(f"wrote {paths['json']}, {paths['md']} and {len(paths) - 2} plot(s)")


def _plan(exp, pilot: Optional[Path], quick: bool) -> None:
    """``seeupo sweep NAME --plan``: the seeds each primary needs, simulated from the pilot's spread."""
    from seeupo.sweep.planning import pilot_spreads, plan_table

    if not exp.primaries():
        fail(f"experiment {exp.name} declares no primary contrasts: nothing to plan (it is exploratory as a whole)")
    if pilot is None:
        fail("--plan needs --pilot RECORDS: the records (or sweep folder) of an earlier experiment holding the "
             "primaries' arms, whose paired differences give the spread")
    try:
        spreads = pilot_spreads(exp, pilot)
    except ValueError as e:
        fail(str(e))
    with console.status("simulating the primary family"):
        lines = plan_table(exp, spreads, quick=quick)
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command("report")
def report_cmd(out: Path = typer.Argument(..., help="a sweep folder, or one run's folder")) -> None:
    """(Re)write a sweep's results.json, report.md and plots from its trial folders; for one run's
    folder, its per-turn analysis (turns.json, turns.md, turns.png: success, reward, advantage x
    factor, factor and turn ratio per turn, early vs late in the run)."""
    _report(out)


SETUPS = {
    # name: (pip arguments, import check, why it is not a plain extra)
    "bfcl": (["--no-deps", "bfcl-eval=={bfcl}", "mpmath"], "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker",
             "bfcl-eval's declared dependencies pin numpy 1.26 and pull ~1.9 GB of API clients; "
             "its backends need only mpmath"),
    "textworld": (["textworld=={textworld}"], "textworld.generator",
                  "the same as `pip install 'seeupo[textworld]'`, offered for symmetry"),
}


@app.command("setup")
def setup(
    name: str = typer.Argument(..., help=f"what to install: {', '.join(SETUPS)}"),
) -> None:
    """Install an optional environment's package into this Python environment (idempotent)."""
    import importlib
    import importlib.metadata as md
    import subprocess

    from seeupo.envs.bfcl import BFCL_VERSION
    from seeupo.envs.textworld import TEXTWORLD_VERSION

    if name not in SETUPS:
        console.print(f"[red]unknown setup {name!r}[/]; available: {', '.join(SETUPS)}")
        raise typer.Exit(2)
    args, module, why = SETUPS[name]
    args = [a.format(bfcl=BFCL_VERSION, textworld=TEXTWORLD_VERSION) for a in args]
    pins = {a.split("==")[0]: a.split("==")[1] for a in args if "==" in a}
    try:
        if all(md.version(p) == v for p, v in pins.items()):
            importlib.import_module(module)
            console.print(f"{name}: already installed ({', '.join(f'{p} {v}' for p, v in pins.items())})")
            return
    except (md.PackageNotFoundError, ImportError):
        pass
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args]
    console.print(f"{name}: {' '.join(cmd[2:])}  ({why})")
    rc = subprocess.call(cmd)
    if rc != 0:
        console.print(f"[red]{name}: pip failed (exit {rc})[/]")
        raise typer.Exit(rc)
    importlib.invalidate_caches()
    importlib.import_module(module)
    console.print(f"{name}: installed")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
