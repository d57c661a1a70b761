"""Run control: the warm-up, the evaluations before, during and after RL, the RL iterations, checkpoints
and resumption, signals (a stop at a safe point), non-finite steps, the run's files and summary.
``Trainer`` composes the policy (``stack.PolicyStack``: model, sampler, rollout source), the update
(``iteration.Updater``: advantages, phases, optimizer) and evaluation (``evaluation.evaluate``).

Determinism: every episode's seed is derived from (run seed, iteration, task, sample), task choice
and minibatch shuffles from (run seed, iteration), so a resumed run repeats the uninterrupted one.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from pathlib import Path

import torch
import yaml

from seeupo.data.episode import Episode
from seeupo.train import checkpoint, memory, parallel
from seeupo.train.config import Config, resolved_dump, save_config
from seeupo.train import evaluation
from seeupo.train.evaluation import EvalResult, evaluate, stage
from seeupo.train.iteration import Updater, mean_steps, health_warnings, schedule_line
from seeupo.train.runlog import NullLog, RunLog, code_version, dumps, platform_info, plot_curves, read_metrics  # noqa: F401
from seeupo.train.stack import PolicyStack
from seeupo.train.warmup import warmup


class Trainer:
    def __init__(self, cfg: Config, *, resume: bool = False, overwrite: bool = False, console=None, bar=None):
        """``bar``: a rich ``Progress`` for the long stages (warm-up, evaluation), or None.
        ``resume``: continue the run in ``run.out`` from its latest checkpoint; ``overwrite``: replace
        the run there (otherwise a folder holding a run is refused with ``checkpoint.RunExists``).
        Nothing is written until ``run()``."""
        parallel.init(cfg.parallel.strategy)
        main = parallel.is_main()  # only the main process prints, writes files and shows progress
        self.cfg, self.resume, self.overwrite = cfg, resume, overwrite
        self.console, self.bar = (console, bar) if main else (None, None)
        self.out = Path(cfg.run.out)
        self.stack = PolicyStack(cfg)
        self.updater = Updater(cfg, self.stack, say=self._say)
        # the micro-batch that fits run.max_memory_gb: the stack's own budget (the config is left as it is)
        self.memory = self.stack.fit_memory(cfg.run.max_memory_gb, kl_reference=cfg.algo.kl_coef > 0)
        if self.memory is not None and self.memory.lowered_from:
            self._say(f"[yellow]{self.memory.line()}[/]")
        self.state: dict = {}
        self._signals = _Signals(self._say)  # replaced by the run's own (installed) one
        self._log = NullLog()

    def close(self) -> None:
        self.stack.close()

    # ----------------------------------------------------------------- helpers
    def _say(self, msg: str) -> None:
        if self.console:
            self.console.print(msg)

    def _stage(self, description: str, total: int, stop=None):
        return stage(self.bar, description, total, stop)

    def evaluate(self, *, policy=None, tag: str = "eval", detailed: bool = False, stop=None) -> EvalResult:
        """``evaluation.evaluate`` of the run's policy, on the run's progress bar."""
        return evaluate(self.stack, policy=policy, tag=tag, detailed=detailed, stop=stop, bar=self.bar)

    def _episodes(self, iteration: int) -> list[Episode]:
        return self.stack.train_episodes(iteration, on_progress=self._stopper())  # a stop before the update loses nothing

    def update(self, episodes: list[Episode], it: int) -> dict:
        """``Updater.update``: the learner's part of iteration ``it`` on ``episodes``."""
        return self.updater.update(episodes, it)

    # ----------------------------------------------------------------- one iteration
    def iteration(self, it: int) -> dict:
        t0 = time.perf_counter()
        episodes = self._episodes(it)
        memory.trim()  # the sampler's caches and batches, freed: their pages go back before the update
        t_roll = time.perf_counter() - t0
        lr = self.updater.set_lr(it)
        record = self.update(episodes, it)
        memory.trim()  # the update's activations
        self.stack.weights_changed()
        record.update({"lr": lr, "time/rollout_s": t_roll, "time/update_s": time.perf_counter() - t0 - t_roll})
        return record

    # ----------------------------------------------------------------- the run
    def _wall(self) -> float:
        return self._wall_prior + time.perf_counter() - self._wall0

    def _save(self, iteration: int) -> Path | None:
        self.state["wall_seconds"] = self._wall()
        self.state["log_lines"] = self._log.lines
        # whole tensors (every process takes part in gathering sharded ones), written by the main process
        tensors = {n: parallel.full(p.detach()) for n, p in self.stack.named_params}
        opt_state = parallel.full_optimizer_state(self.updater.optimizer)
        reference = self.updater.reference_state
        ref = {n: parallel.full(v) for n, v in reference.items()} if reference else None
        if not parallel.is_main():
            parallel.barrier()
            return None
        path = checkpoint.save(self.out, iteration=iteration, tensors=tensors, optimizer_state=opt_state,
                               state=self.state, config_yaml=yaml.safe_dump(resolved_dump(self.cfg), sort_keys=False),
                               reference=ref)
        parallel.barrier()
        return path

    def _check_stop(self, *, collective: bool = True) -> None:
        """A safe point: raise ``_Stop`` when SIGTERM/SIGINT arrived (on any process, when
        ``collective``: every process must reach this call; otherwise only single-process runs stop
        here, as the processes would otherwise disagree)."""
        flag = self._signals.signum is not None
        if parallel.world() > 1:
            if not collective:
                return
            flag = parallel.any_true(flag)
        if flag:
            raise _Stop()

    def _stopper(self):
        """A rollout/evaluation progress callback that stops at the next turn boundary (one process)."""
        return lambda *a: self._check_stop(collective=False)

    def _resume_state(self) -> int:
        """Load the latest checkpoint; returns its iteration (None: there is none, start afresh)."""
        ck = checkpoint.latest(self.out)
        if ck is None:
            return None
        self.state = checkpoint.load(ck, self.stack.named_params, self.updater.optimizer)
        self.stack.weights_changed()
        if self.cfg.algo.kl_coef > 0:
            ref = checkpoint.load_reference(ck)
            named = self.stack.named_params
            self.updater.reference_state = ({n: parallel.like(ref[n], p) for n, p in named if n in ref}
                                            if ref else checkpoint.trainable_state(named))
        self._wall_prior = self.state.get("wall_seconds", 0.0)
        self._say(f"resumed from {ck} at iteration {self.state['iteration']}")
        return self.state["iteration"]

    def _warmup(self) -> None:
        cfg = self.cfg
        w = cfg.warmup
        kind = ("format-only demonstration episodes" if w.source == "demo" else "expert demonstration episodes"
                if w.oracle_prob == 1 else f"demonstration episodes ({w.oracle_prob:.0%} the expert's, the rest format-only)")
        self._say(f"warm-up: {w.episodes} {kind} of training tasks")
        steps = cfg.warmup.epochs * -(-cfg.warmup.episodes // cfg.warmup.batch_episodes)
        tick, close = self._stage("warm-up (supervised steps)", steps)
        done = iter(range(1, steps + 1))

        def progress(loss):
            if tick:
                tick(next(done))
            self._check_stop()  # every process takes every warm-up step

        st = self.stack
        params, by_adapter = st.prepare_warmup()
        try:
            self.state["warmup"] = warmup(
                st.learner_model, params, st.chat, st.family, st.limits, cfg.warmup,
                seed=cfg.run.seed, budget_tokens=st.micro_batch_tokens, pack=cfg.optim.pack_width,
                share=cfg.optim.share_prefix, by_adapter=by_adapter, progress=progress,
                cache=cfg.warmup.cache, cache_key={"model": cfg.model.model_dump(mode="json"), "device": cfg.run.device},
                say=self._say if parallel.is_main() else None)
        finally:
            close()
        self.stack.weights_changed()

    def _eval_before(self) -> dict:
        """The evaluation before RL (``EvalResult.as_dict``); with ``eval.cache`` (one process, the HF
        sampler) taken from the cache when a run with the same warmed-up model and settings scored it
        already, else computed and stored there."""
        cfg = self.cfg
        path = None
        if cfg.eval.cache and parallel.world() == 1 and cfg.rollout.backend == "hf":
            path = Path(cfg.eval.cache) / f"{evaluation.cache_key(self.stack)}.json"
            cached = evaluation.load_cached(path, self._say)
            if cached is not None:
                self._say(f"eval before RL: reused {path} (the same warmed-up model, settings and seed)")
                self.state["eval_before_reused"] = True
                return cached
        ev = self.evaluate(stop=self._stopper()).as_dict()
        memory.trim()  # the evaluation's KV caches
        if path is not None:  # a temporary file of its own renamed into place: workers may race to write it
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(dumps(ev, indent=1))
            os.replace(tmp, path)
        return ev

    def _eval_due(self, done: int) -> bool:
        every = self.cfg.eval.every
        return bool(every) and done % every == 0 and 0 < done < self.cfg.run.iterations

    def _periodic_eval(self, done: int) -> None:
        ev = self.evaluate(stop=self._stopper())
        memory.trim()
        self._log.log({"iteration": done, "eval": ev.as_dict()})
        self.state["evaluated_at"] = done

    def run(self, progress=None) -> dict:
        """Warm-up, evaluation before RL, ``run.iterations`` RL iterations, evaluation after; returns
        the summary. SIGTERM/SIGINT stop it at the next safe point with a checkpoint (``RunInterrupted``);
        ``run.max_nonfinite`` skipped steps in a row stop it with ``NonFiniteStop``. ``progress(done,
        record)`` is called once with ``record`` None when RL starts, then after each iteration."""
        start = self._start()
        try:
            with self._signals:
                try:
                    start = self._before_rl(start)
                    self._loop(start, progress)
                    self._at = max(self.cfg.run.iterations, start)
                    ev = self.evaluate(stop=self._stopper())
                    self._log.log({"iteration": self._at, "eval": ev.as_dict(), "final": True})
                except _Stop:
                    # the state at `_at` is whole here (a stop never lands inside an update); the warm-up has no
                    # checkpoint to write yet
                    path = self._save(self._at) if self._saved_at is not None else None
                    raise RunInterrupted(self._signals.signum, self._at, path, self.out) from None
        finally:
            self._log.close()
            self.close()
        return self._finish(start, ev)

    def _start(self) -> int | None:
        """The run folder (cleared unless resumed), the config, the log, signal handling and the
        platform record; returns the iteration of the checkpoint resumed from (None: a fresh run)."""
        cfg = self.cfg
        self._wall0, self._wall_prior = time.perf_counter(), 0.0
        main = parallel.is_main()
        if main:
            self.out.mkdir(parents=True, exist_ok=True)
            if not self.resume:
                checkpoint.clear_run(self.out, overwrite=self.overwrite)
            save_config(cfg, self.out / "config.yaml")
        self._say(f"schedule of {cfg.algo.name}: {schedule_line(self.updater.schedule)}")
        start = self._resume_state() if self.resume else None
        if self.resume and start is None:
            self._say(f"--resume: no checkpoint in {self.out} (the run stopped before its first one, during the "
                      "warm-up): starting it from the beginning")
        self._log = (RunLog(self.out, cfg.run.loggers, resume_lines=self.state.get("log_lines") if start is not None else None,
                            resume_from=start, config=cfg.model_dump(mode="json")) if main else NullLog())
        self._signals = _Signals(self._say)
        self._nonfinite_run = self.state.get("nonfinite_run", 0)
        here = platform_info()  # a resumed run may continue elsewhere: every platform it ran on is kept
        self.state["platforms"] = [*[p for p in self.state.get("platforms", []) if p != here], here]
        self._at = start or 0  # the iteration a stop would checkpoint
        self._saved_at = start  # the iteration of the newest checkpoint
        return start

    def _before_rl(self, start: int | None) -> int:
        """A fresh run's warm-up, KL reference and checkpoint 0; the evaluation before RL (once per
        run); returns the first RL iteration."""
        cfg = self.cfg
        if start is None:
            if self.stack.warmup_enabled():
                self._warmup()
                memory.trim()  # the warm-up's activations: the largest the run holds
            if cfg.algo.kl_coef > 0:
                self.updater.reference_state = checkpoint.trainable_state(self.stack.named_params)
            self.state["run_id"] = checkpoint.new_run_id()
            self._save(0)  # the warmed-up model, before the (long) evaluation
            self._saved_at, start = 0, 0
            self._check_stop()
        if "eval_before" not in self.state:
            ev = self._eval_before()
            self.state["eval_before"] = ev
            self._log.log({"iteration": 0, "eval": ev, **self.state.get("warmup", {})})
            env = "".join(f", {k} {v:.3f}" for k, v in ev.get("env", {}).items())
            self._say(f"eval before RL: avg@{ev['k']} {ev['avg@k']:.3f}, pass@{ev['k']} {ev['pass@k']:.3f} "
                      f"on {ev['tasks']} tasks" + (f" (per episode{env})" if env else ""))
        if start >= cfg.run.iterations and "eval_before" in self.state and start > 0:
            self._say(f"[yellow]checkpoint is at iteration {start}, run.iterations={cfg.run.iterations}: "
                      "nothing to train; raise run.iterations to continue[/]")
        if not cfg.optim.train_embeddings:
            self.stack.freeze_embeddings()
        if self._eval_due(start) and self.state.get("evaluated_at") != start:
            self._periodic_eval(start)  # interrupted there before
        return start

    def _loop(self, start: int, progress) -> None:
        """The RL iterations from ``start``: each logged with its health warnings, the non-finite
        guard, the periodic evaluations and checkpoints."""
        cfg = self.cfg
        if progress:
            progress(start, None)  # RL starts now: ``record`` None, nothing trained yet
        for it in range(start, cfg.run.iterations):
            self._at = it
            self._check_stop()
            record = self.iteration(it)
            self._nonfinite(record)
            record["warnings"] = health_warnings(record)
            for w in record["warnings"]:
                self._say(f"[yellow]iteration {it}: {w}[/]")
            self._log.log(record)
            if progress:
                progress(it + 1, record)
            done = self._at = it + 1
            self.state["nonfinite_run"] = self._nonfinite_run
            if self._nonfinite_run >= cfg.run.max_nonfinite:
                raise NonFiniteStop(self._nonfinite_message(it, self._saved_at))
            self._check_stop()
            if self._eval_due(done):
                self._periodic_eval(done)
            if (cfg.run.checkpoint_every and done % cfg.run.checkpoint_every == 0) or done == cfg.run.iterations:
                self._save(done)
                self._saved_at = done

    def _finish(self, start: int, ev) -> dict:
        """The summary: the evaluations, the trainable parameters' norm and digest, what the run
        used; written to ``summary.json`` with the curves' plot."""
        cfg, main = self.cfg, parallel.is_main()
        with torch.no_grad():
            full = [parallel.full(p.detach()) for p in self.stack.params]
            l2 = float(torch.sqrt(sum((p.double() ** 2).sum() for p in full)))
            digest = hashlib.sha256()  # the trainable parameters to the bit (float32 bytes, in order)
            for p in full:
                digest.update(p.float().cpu().contiguous().numpy().tobytes())
        records = read_metrics(self.out) if main else []
        summary = {
            "algorithm": cfg.algo.name, "model": cfg.model.name, "env": cfg.env.name, "seed": cfg.run.seed,
            "eval_before": self.state["eval_before"], "eval_after": ev.as_dict(),
            "eval_before_reused": bool(self.state.get("eval_before_reused")),  # from eval.cache: scored by another run
            "iterations": max(cfg.run.iterations, start),
            "wall_seconds": self._wall(),
            "trainable_param_l2": l2,
            "trainable_param_sha256": digest.hexdigest(),
            "micro_batch_tokens": self.stack.micro_batch_tokens,  # the budget used (fit_memory may lower the configured one)
            "warmup": self.state.get("warmup"),
            "platforms": self.state["platforms"],
            "nonfinite_skips": sum(r.get("nonfinite_skips", 0) for r in records if "reward_mean" in r),
            "episodes_excluded": sum(r.get("episodes_excluded", 0) for r in records if "reward_mean" in r),
            "estimator": cfg.algo.estimator_params(),  # the advantage estimator and the parameter values used
            "code": code_version(),
            "schedule": {**self.updater.schedule.as_dict(),
                         "optimizer_steps_per_iteration": mean_steps(records) if main else None},
        }
        try:
            if main:
                checkpoint.write_atomic(self.out / "summary.json", dumps(summary, indent=1))
                plot_curves(self.out, records, f"{cfg.algo.name} on {cfg.env.name} ({cfg.model.name})")
        finally:
            parallel.barrier()  # every process leaves once the run's files are written (or failed to be)
        return summary

    def _nonfinite(self, record: dict) -> None:
        """Skipped steps in a row (the guard in ``learner.optimizer_step``), across iterations."""
        flags = record.pop("_skips", [])
        for f in flags:
            self._nonfinite_run = self._nonfinite_run + 1 if f else 0
        if record.get("nonfinite_skips"):
            self._say(f"[yellow]iteration {record['iteration']}: {record['nonfinite_skips']} optimizer step(s) had a "
                      "non-finite loss or gradient and were skipped (not applied)[/]")

    def _nonfinite_message(self, it: int, saved_at) -> str:
        last = checkpoint.latest(self.out)
        return (f"stopped at iteration {it}: {self._nonfinite_run} optimizer steps in a row had a non-finite loss or "
                f"gradient (run.max_nonfinite={self.cfg.run.max_nonfinite}); none was applied. Last checkpoint: "
                f"{last or 'none'}. Usual causes: rollout.temperature far below 1 (log-probs overflow), a learning "
                "rate too high, a reward or advantage that is NaN/Inf (algo.advantage_clip bounds the latter)")


class _Stop(Exception):
    """Raised at a safe point after SIGTERM/SIGINT (caught in ``Trainer.run``)."""


class RunInterrupted(Exception):
    """SIGTERM or SIGINT stopped the run at a safe point; ``checkpoint`` holds it (None: the signal came
    during the warm-up, before the first checkpoint; ``--resume`` redoes the warm-up)."""

    def __init__(self, signum, iteration: int, checkpoint_path, out: Path):
        self.signum, self.iteration, self.checkpoint, self.out = signum, iteration, checkpoint_path, out
        name = signal.Signals(signum).name if signum else "a signal"
        where = (f"checkpoint {checkpoint_path} (iteration {iteration})" if checkpoint_path
                 else "no checkpoint yet (stopped during the warm-up; resuming redoes it)")
        super().__init__(f"{name}: stopped at a safe point; {where}. Continue with: seeupo train --resume --out {out}")

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum or signal.SIGTERM)


class NonFiniteStop(RuntimeError):
    """``run.max_nonfinite`` optimizer steps in a row were skipped by the non-finite guard."""


class _Signals:
    """SIGTERM and SIGINT set a flag that the run checks at safe points; a second signal raises
    ``KeyboardInterrupt`` at once. Installed only in the main thread (signals go there)."""

    def __init__(self, say):
        self.say, self.signum, self.old = say, None, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(s) is not signal.SIG_IGN:  # an ignored signal stays ignored (background jobs)
                    self.old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        os.write(2, f"\n{signal.Signals(signum).name}: stopping at the next safe point with a checkpoint "
                    "(send it again to exit at once)\n".encode())

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)
        self.old = {}
        return False
