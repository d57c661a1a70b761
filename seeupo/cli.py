"""The ``seeupo`` command line: ``train``, ``eval``, ``sample``, ``summarize``, ``sweep``, ``report``,
``setup``, ``lab table1``, ``lab reach`` and ``lab limits`` (``seeupo --help`` lists them with what each does)."""

from __future__ import annotations

import functools
import os
import sys
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


def _say(text) -> None:
    """A line or a table for the user, never read as markup (a line may hold "[0.9,")."""
    console.print(text, markup=False, highlight=False, soft_wrap=isinstance(text, str))


def _usage(command):
    """A command whose refusals (``seeupo.errors.usage_errors``) print one line and exit 2."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        from seeupo.errors import usage_errors

        try:
            return command(*args, **kwargs)
        except usage_errors() as e:
            fail(str(e))
    return run


def _lab_command(name: str, quick_help: str, doc: str) -> None:
    """``seeupo lab NAME``: one lab table (seeupo/lab/NAME.py) with the options every table takes."""
    def command(
        out: Path = typer.Option(Path(f"runs/{name}"), "--out", help=f"Folder for {name}.json, {name}.md, {name}.png."),
        quick: bool = typer.Option(False, "--quick", help=quick_help),
        seeds: Optional[int] = typer.Option(None, "--seeds", min=1, help="Seeds per row (default 5 quick, 20 full)."),
        workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes (default: up to 2)."),
    ) -> None:
        from seeupo.lab.command import run_named

        for shown in run_named(name, quick, seeds, workers, out, _progress()):
            _say(shown)
    command.__doc__ = doc
    lab_app.command(name)(command)


_lab_command("table1", "5 seeds x 120 iterations (under a minute on 2 cores).",
             "Measure the paper's Table 1: monotonic improvement and convergence of every algorithm.")
_lab_command("reach", "5 seeds x 60 iterations, 40 search instances per shape.",
             """How far the guarantees reach: trap instances with the bandit view broken (a stochastic tool, a
    noisy observation, intermediate rewards, variable length), gradient steps beside each phase's
    surrogate solved exactly, and a search for a drop under the exact step (docs/lab.md).""")
_lab_command("limits", "5 seeds x 60 iterations.",
             """The two limits on one axis: PPO and Turn-PPO with a critic of growing error (noise, bias) beside
    SeeUPO, GRPO and GiGPO with the bandit view broken by degrees, on the trap family: the
    share of seeds that improve monotonically and that reach the optimum (docs/lab.md).""")


@app.command(context_settings={"allow_extra_args": False})
@_usage
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
    from seeupo.progress import rl_bar
    from seeupo.train.launch import build_config, done_line, preflight
    from seeupo.train.trainer import NonFiniteStop, RunInterrupted, Trainer

    if resume and overwrite:
        fail("--resume and --overwrite contradict each other; choose one")
    cfg = build_config(preset, overrides, algo=algo, model=model, env=env, out=out, steps=steps, seed=seed,
                       resume=resume, agent=agent)
    if not resume and not overwrite and ckpt.holds_run(Path(cfg.run.out)):
        fail(f"{cfg.run.out} already holds a run; continue it with --resume, replace it with --overwrite, "
             "or choose a new --out")
    preflight(cfg)
    console.print(f"[bold]seeupo train[/]: {cfg.algo.name} | model {cfg.model.name} | env {cfg.env.name} | "
                  f"{cfg.run.iterations} iterations of {cfg.rollout.tasks_per_iteration}x{cfg.rollout.group_size} "
                  f"episodes | out {cfg.run.out}")
    with _progress() as bar:
        try:
            trainer = Trainer(cfg, console=console, resume=resume, overwrite=overwrite, bar=bar)
        except KeyboardInterrupt:  # before the run's own handler is installed: nothing written yet
            bar.stop()
            err_console.print("interrupted while loading; nothing was written", style="yellow", markup=False)
            raise typer.Exit(130)
        try:
            summary = trainer.run(progress=rl_bar(bar, cfg.run.iterations))
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
    _say(done_line(summary, cfg.run.out))


@app.command("eval")
@_usage
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
    from seeupo.train.evaluation import SCRIPTED_POLICIES, result_table, summary_line
    from seeupo.train.launch import build_config, evaluate_run, run_config

    if policy != "model" and policy not in SCRIPTED_POLICIES:
        raise typer.BadParameter(f"--policy must be one of: model, {', '.join(SCRIPTED_POLICIES)}")
    extra = [*(overrides or []), f"eval.split={split}", f"eval.k={k}", "warmup.enabled=off",
             *([f"eval.tasks={max_tasks}"] if max_tasks else ["eval.tasks=1000000"])]
    if checkpoint_dir:
        extra += [f"{key}={v}" for key, v in (("model.name", model), ("env.name", env)) if v is not None]
        cfg = run_config(checkpoint_dir, extra)
    else:
        cfg = build_config(preset, extra, model=model, env=env)
    bar = _progress()
    bar.start()
    try:
        res, seconds = evaluate_run(cfg, checkpoint_dir, policy, bar, say=_say, out=out)
    finally:
        bar.stop()
    console.print(result_table(res, title=f"{cfg.env.name} / {split} / policy {policy}"))
    _say(summary_line(res, seconds))


@app.command("serve")
@_usage
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
    from seeupo.train.launch import build_config, policy, run_config

    extra = [*(overrides or []), "warmup.enabled=off", "rollout.agent=null"]  # a run's agent is not served
    if checkpoint_dir:
        cfg = run_config(checkpoint_dir, extra + ([f"model.name={model}"] if model else []))
    else:
        cfg = build_config(preset, extra, model=model)
    stack = policy(cfg, checkpoint_dir, say=_say)
    engine = ChatEngine.from_config(stack.sampler, stack.chat, cfg, max_new_tokens=max_tokens, temperature=None)
    console.print(f"serving {cfg.model.name} on http://{host}:{port}/v1 (model name {cfg.model.name!r}; Ctrl-C stops)")
    serve_forever(engine, host, port)


@app.command("sample")
@_usage
def sample(
    checkpoint_dir: Path = typer.Argument(..., help="a run folder: its latest checkpoint is loaded"),
    n: int = typer.Option(64, "--n", min=1, help="episodes to sample"),
    task_index: int = typer.Option(0, "--task", min=0, help="index of the task in the split"),
    split: str = typer.Option("test", "--split"),
    top: int = typer.Option(12, "--top", min=1, help="most frequent response sequences shown"),
) -> None:
    """Sample episodes of one task from a checkpoint and tally the turn-by-turn responses (what the
    policy actually does, and whether it depends on the turn)."""
    from seeupo.train.launch import run_config, sample_responses

    cfg = run_config(checkpoint_dir, ["warmup.enabled=off"])
    path, task, success, counts = sample_responses(cfg, checkpoint_dir, n, task_index, split)
    _say(f"{path}: task {task.id}, {n} episodes, success {success:.3f}")
    t = Table(title="most frequent responses, turn by turn")
    t.add_column("count")
    t.add_column("responses")
    for seq, c in counts.most_common(top):
        t.add_row(str(c), " | ".join(seq))
    console.print(t)


@app.command("summarize")
def summarize(
    runs: list[Path] = typer.Argument(..., help="run folders (each with a summary.json)"),
    out: Optional[Path] = typer.Option(None, "--out", help="also write the table as JSON here"),
) -> None:
    """Before/after held-out avg@k and pass@k of finished runs, per run and per algorithm (mean +- std)."""
    from seeupo.sweep.summarize import per_algorithm, read_runs, tables, write_json

    found, skipped = read_runs(runs)
    for r in skipped:
        console.print(f"[yellow]{r}: no summary.json (unfinished?), skipped[/]")
    if not found:
        raise typer.Exit(1)
    agg = per_algorithm(found)
    for t in tables(found, agg):
        console.print(t)
    if out:
        write_json(out, found, agg)


@app.command("sweep")
@_usage
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
    from seeupo.sweep import command
    from seeupo.sweep.experiment import load_experiment
    from seeupo.sweep.study import SweepSpec

    exp = load_experiment(experiment)
    exp.validate_arms(quick)
    if plan:
        with console.status("simulating the primary family"):
            lines = command.plan(exp, pilot, quick)
        for line in lines:
            _say(line)
        return
    if out is None:
        fail("seeupo sweep: --out DIR is needed (the sweep folder)")
    if not allow_underpowered:
        command.refuse_underpowered(exp, quick, experiment)
    spec = SweepSpec(exp, out, quick, storage=storage, workers=workers or max(1, command.cores() // trial_threads),
                     trial_threads=trial_threads, max_retries=max_retries, heartbeat=heartbeat, records=records)
    code = command.run(spec, experiment, reuse_records or [], say=_say,
                       warn=lambda m: err_console.print(m, style="yellow", markup=False))
    if code == 130:
        raise typer.Exit(130)
    command.report(out, _say)
    if code:
        raise typer.Exit(code)


@app.command("report")
@_usage
def report_cmd(out: Path = typer.Argument(..., help="a sweep folder, or one run's folder")) -> None:
    """(Re)write a sweep's results.json, report.md and plots from its trial folders; for one run's
    folder, its per-turn analysis (turns.json, turns.md, turns.png: success, reward, advantage x
    factor, factor and turn ratio per turn, early vs late in the run)."""
    from seeupo.sweep.command import report

    report(out, _say)


@app.command("setup")
def setup(
    name: str = typer.Argument(..., help="what to install: bfcl, textworld"),
) -> None:
    """Install an optional environment's package into this Python environment (idempotent)."""
    from seeupo.envs.setup import SETUPS, install

    if name not in SETUPS:
        console.print(f"[red]unknown setup {name!r}[/]; available: {', '.join(SETUPS)}")
        raise typer.Exit(2)
    if rc := install(name, _say):
        raise typer.Exit(rc)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
