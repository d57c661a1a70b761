"""Reliability: interrupted runs resume bit-identically, non-finite steps are never applied, run
folders are never clobbered, bad inputs exit 2 with one line, hanging environments time out."""

import json
import math
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import seeupo.train.stack as stack_mod
import seeupo.train.trainer as trainer_mod
from seeupo.cli import app
from seeupo.train import checkpoint
from seeupo.train.config import load_config
from seeupo.train.iteration import Updater
from seeupo.train.trainer import RunInterrupted, Trainer

pytestmark = pytest.mark.usefixtures("one_thread_module")  # runs compared to the bit (tests/conftest.py)

SMALL = ["warmup.episodes=32", "warmup.epochs=1", "eval.tasks=2", "eval.k=2", "rollout.tasks_per_iteration=2",
         "rollout.group_size=2", "run.loggers=[jsonl]", "run.checkpoint_every=1", "run.iterations=3",
         "eval.every=2"]
TIMING = ("time/rollout_s", "time/update_s")


def _lines(folder: Path) -> list[dict]:
    """metrics.jsonl, strictly parsed (NaN/Infinity are not JSON), timing fields dropped."""
    def no_constants(x):
        raise ValueError(f"non-JSON constant {x} in metrics.jsonl")
    out = []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line, parse_constant=no_constants)
        out.append({k: v for k, v in r.items() if k not in TIMING})
    return out


def _l2(tr: Trainer) -> float:
    return float(torch.sqrt(sum((p.detach().double() ** 2).sum() for p in tr.stack.params)))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, one_thread_module):
    out = tmp_path_factory.mktemp("full")
    s = Trainer(load_config("tiny", [*SMALL, f"run.out={out}"])).run()
    return out, s


def _signal_self():
    os.kill(os.getpid(), signal.SIGTERM)


def _hook(monkeypatch, point: str):
    """Send SIGTERM to this process at ``point`` of the run (a real signal, caught by the run's handler)."""
    if point == "warmup":
        orig = trainer_mod.warmup

        def warmup(*a, progress, **kw):
            calls = []

            def prog(loss):
                calls.append(loss)
                if len(calls) == 1:
                    _signal_self()  # after the first of two supervised steps
                progress(loss)
            return orig(*a, progress=prog, **kw)
        monkeypatch.setattr(trainer_mod, "warmup", warmup)
    elif point in ("eval", "rollout"):
        orig = stack_mod.run_episodes
        calls = []

        def run_episodes(*a, on_progress=None, **kw):
            calls.append(1)
            # call 1: the evaluation before RL; call 3: iteration 1's rollout
            target = 1 if point == "eval" else 3
            if len(calls) == target:
                first = []

                def prog(*x):
                    if not first:
                        first.append(1)
                        _signal_self()  # after the first turn
                    if on_progress:
                        on_progress(*x)
                return orig(*a, on_progress=prog, **kw)
            return orig(*a, on_progress=on_progress, **kw)
        monkeypatch.setattr(stack_mod, "run_episodes", run_episodes)
    elif point == "update":
        orig = Updater._update

        def _update(self, episodes, it):
            if it == 1:
                _signal_self()  # the update runs to its end; the run stops after it
            return orig(self, episodes, it)
        monkeypatch.setattr(Updater, "_update", _update)
    elif point == "save":
        orig = checkpoint.save
        sent = []

        def save(folder, *, iteration, **kw):
            if iteration == 1 and not sent:
                sent.append(1)
                _signal_self()  # the write completes; the run stops at the next safe point
            return orig(folder, iteration=iteration, **kw)
        monkeypatch.setattr(checkpoint, "save", save)


@pytest.mark.parametrize("point", ["warmup", "eval", "rollout", "update", "save"])
def test_sigterm_then_resume_equals_the_uninterrupted_run(tmp_path, monkeypatch, uninterrupted, point):
    ref_dir, ref = uninterrupted
    cfg = load_config("tiny", [*SMALL, f"run.out={tmp_path}"])
    before = signal.getsignal(signal.SIGTERM)
    with monkeypatch.context() as m:
        _hook(m, point)
        with pytest.raises(RunInterrupted) as info:
            Trainer(cfg).run()
    e = info.value
    assert e.signum == signal.SIGTERM and e.exit_code == 143 and "--resume" in str(e)
    # where it stopped: the warm-up and the first evaluation at 0, a rollout before its update (1),
    # an update after it (2), a save at the next iteration's start (1)
    assert e.iteration == {"warmup": 0, "eval": 0, "rollout": 1, "update": 2, "save": 1}[point]
    assert (e.checkpoint is None) == (point == "warmup")  # the warm-up has nothing to checkpoint yet
    assert signal.getsignal(signal.SIGTERM) is before  # the run's handler is gone
    assert not list((tmp_path / "checkpoints").glob(".tmp-*")) if (tmp_path / "checkpoints").exists() else True
    calls = []
    orig = trainer_mod.warmup
    monkeypatch.setattr(trainer_mod, "warmup", lambda *a, **kw: calls.append(1) or orig(*a, **kw))
    s = Trainer(load_config(str(tmp_path / "config.yaml")), resume=True).run()
    assert calls == ([1] if point == "warmup" else [])  # only a stop during the warm-up redoes it
    assert _lines(tmp_path) == _lines(ref_dir)  # every line (training, evaluations, final) bit for bit
    assert s["trainable_param_l2"] == ref["trainable_param_l2"]
    assert s["eval_after"] == ref["eval_after"]


def test_cli_sigterm_checkpoints_and_says_how_to_resume(tmp_path):
    """The real command in its own process: SIGTERM after the first iteration -> exit 143, a
    checkpoint, the resume command; --resume then finishes the run."""
    import subprocess
    import sys

    out = tmp_path / "run"
    args = [sys.executable, "-m", "seeupo", "train", "--preset", "tiny", "--out", str(out), *SMALL[:-3],
            "run.iterations=200", "run.checkpoint_every=0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        m = out / "metrics.jsonl"
        if m.exists() and any("reward_mean" in json.loads(x) for x in m.read_text().splitlines() if x.endswith("}")):
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, (stdout, stderr)
    assert f"seeupo train --resume --out {out}" in stderr and "Traceback" not in stderr
    ck = checkpoint.latest(out)
    it = json.loads((ck / "state.json").read_text())["iteration"]
    assert it >= 1, stderr  # at least the finished iteration is kept (checkpoint_every=0 would keep none)
    res = CliRunner().invoke(app, ["train", "--resume", "--out", str(out), "--steps", str(it + 1)])
    assert res.exit_code == 0, res.output
    assert [r["iteration"] for r in _lines(out) if "reward_mean" in r] == list(range(it + 1))


def test_second_signal_exits_at_once():
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # SIG_IGN when the suite runs in the background
    try:
        sig = trainer_mod._Signals(lambda m: None)
        with sig:
            os.kill(os.getpid(), signal.SIGINT)
            assert sig.signum == signal.SIGINT
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler raises here
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, old)


def test_an_ignored_signal_stays_ignored():
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a shell's background job
    try:
        with trainer_mod._Signals(lambda m: None) as sig:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
            assert sig.signum is None
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)


def test_killed_checkpoint_write_leaves_the_previous_one(tmp_path):
    """A write killed mid-way (its temporary folder and marker left behind) never shows as a
    checkpoint; the next load and save clean it up."""
    state = {"run_id": "a"}
    t = {"w": torch.ones(3)}
    checkpoint.save(tmp_path, iteration=1, tensors=t, optimizer_state={}, state=state, config_yaml="")
    root = tmp_path / "checkpoints"
    (root / ".tmp-000002").mkdir()
    (root / ".tmp-000002" / "trainable.safetensors").write_bytes(b"half")
    (root / "latest.tmp").write_text("iter-000002")
    assert checkpoint.latest(tmp_path) == root / "iter-000001"
    assert not (root / ".tmp-000002").exists() and not (root / "latest.tmp").exists()


def test_pruning_orders_by_iteration_and_keeps_other_runs(tmp_path):
    t = {"w": torch.ones(1)}

    def save(it, run):
        checkpoint.save(tmp_path, iteration=it, tensors=t, optimizer_state={}, state={"run_id": run}, config_yaml="")
    save(5, "old")
    save(999999, "new")
    save(1000000, "new")  # 7 digits: sorts before iter-999999 by name
    save(1000001, "new")
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("iter-*"))
    # this run's newest two by number, the other run's untouched
    assert names == ["iter-000005", "iter-1000000", "iter-1000001"]


def _strict_json(path: Path):
    def bad(x):
        raise ValueError(f"{path}: non-JSON constant {x}")
    return json.loads(path.read_text(), parse_constant=bad)


def test_nonfinite_temperature_stops_with_counted_skips_and_no_nan_written(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["train", "--preset", "tiny", "--steps", "2", "--out", str(out),
                                   *SMALL[:-3], "rollout.temperature=1e-40"])
    assert res.exit_code == 1, res.output
    assert "non-finite" in res.output and "Traceback" not in res.output
    lines = _lines(out)
    train = [r for r in lines if "reward_mean" in r]
    assert train and train[0]["nonfinite_skips"] == 4 and train[0]["optimizer_steps"] == 0
    assert train[0]["loss"] is None and train[0]["logp_gap_max"] is None  # NaN shows as null, not 0.0
    for f in out.rglob("*.json"):
        _strict_json(f)
    from safetensors.torch import load_file

    for f in out.rglob("*.safetensors"):
        assert all(torch.isfinite(v).all() for v in load_file(f).values()), f


def test_guard_never_applies_a_nonfinite_step(tiny):
    from seeupo.data.episode import Episode, trajectory_rows
    from seeupo.train.learner import LossSpec, StepInputs, adamw, nan_max, optimizer_step

    model = tiny.model
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    ep = Episode(0, "t", 0, 0, 0)
    ep.append([1, 2, 3])
    ep.append([4, 5], turn=0, logp=[-1.0, -1.0])
    ep.turn_ends.append(5)
    rows = trajectory_rows([ep], 0)
    opt = adamw(params, 1e-2)
    m = optimizer_step(model, opt, params, StepInputs(rows=rows, adv=torch.tensor([float("nan")])),
                       LossSpec("clip_token"), budget_tokens=256, grad_clip=1.0)
    assert m["nonfinite_skip"] == 1.0 and math.isnan(m["loss"])
    assert all(torch.equal(a, p) for a, p in zip(before, params)) and not opt.state
    m = optimizer_step(model, opt, params, StepInputs(rows=rows, adv=torch.tensor([1.0])),
                       LossSpec("clip_token"), budget_tokens=256, grad_clip=1.0)
    assert m["nonfinite_skip"] == 0.0 and any(not torch.equal(a, p) for a, p in zip(before, params))
    assert math.isnan(nan_max(0.0, float("nan"))) and math.isnan(nan_max(float("nan"), 1.0)) and nan_max(1.0, 2.0) == 2.0
    with torch.no_grad():
        for a, p in zip(before, params):
            p.copy_(a)


def test_rerun_on_a_finished_run_is_refused_and_changes_nothing(tmp_path):
    out = tmp_path / "run"
    args = ["train", "--preset", "tiny", "--steps", "1", "--out", str(out), *SMALL[:-3]]
    assert CliRunner().invoke(app, args).exit_code == 0
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    assert [x for x in res.output.splitlines() if x.strip()] == [
        f"error: {out} already holds a run; continue it with --resume, replace it with --overwrite, or choose a new --out"]
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
    (out / "notes.txt").write_text("mine")
    res = CliRunner().invoke(app, [*args, "--overwrite"])
    assert res.exit_code == 0, res.output
    assert (out / "notes.txt").read_text() == "mine"  # --overwrite removes only the run's own files


def test_resume_without_a_checkpoint_starts_afresh(tmp_path):
    cfg = load_config("tiny", [*SMALL, "run.iterations=1", f"run.out={tmp_path}"])
    Trainer(cfg).run()
    with pytest.raises(checkpoint.RunExists):  # the library refuses too, not only the command
        Trainer(cfg).run()
    import shutil

    shutil.rmtree(tmp_path / "checkpoints")
    s = Trainer(load_config(str(tmp_path / "config.yaml")), resume=True).run()
    assert s["iterations"] == 1
    assert [r["iteration"] for r in _lines(tmp_path) if "reward_mean" in r] == [0]


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "broken.yaml").write_text("algo:\n  name: [seeupo\n")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "badexp.yaml").write_text("reference: a\nseeds: [0]\narms: {a: [algo.nmae=x]}\n")
    return tmp_path


BAD_INPUTS = {
    "model folder missing": (["train", "--model", "/nonexistent/path"], "no such folder"),
    "model not offline": (["train", "--model", "nosuchorg/nosuchmodel"], "not reachable"),
    "unknown env": (["train", "--env", "nosuchenv"], "not an environment"),
    "unknown env option": (["train", "env.options.hopz=1"], "hopz"),
    "bad bfcl category": (["train", "--env", "bfcl", "env.options.category=foo"], "category"),
    "cuda without a GPU": (["train", "run.device=cuda"], "no GPU"),
    "preset not YAML": (["train", "--preset", "{d}/broken.yaml"], "not valid YAML"),
    "preset a list": (["train", "--preset", "{d}/list.yaml"], "mapping"),
    "override not YAML": (["train", "algo.factor_clip=[0.9,"], "not valid YAML"),
    "resume without a run": (["train", "--resume", "--out", "{d}/empty"], "holds no run"),
    "resume without --out": (["train", "--resume"], "--out"),
    "eval of an empty folder": (["eval", "--checkpoint", "{d}/empty"], "not a run folder"),
    "sample of an empty folder": (["sample", "{d}/empty"], "not a run folder"),
    "unknown preset": (["train", "--preset", "nosuch"], "no preset"),
    "unknown algorithm": (["train", "--algo", "nosuch"], "not known"),
    "unknown experiment": (["sweep", "nosuch", "--out", "{d}/sw"], "no experiment"),
    "experiment arm with a bad key": (["sweep", "{d}/badexp.yaml", "--out", "{d}/sw"], "arm a"),
    "report of an empty folder": (["report", "{d}/empty"], "neither a sweep folder"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line(case, bad_files, monkeypatch):
    args, needle = BAD_INPUTS[case]
    if case == "bad bfcl category":
        pytest.importorskip("bfcl_eval")
    if case == "cuda without a GPU" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network attempt: the check must not need one
    monkeypatch.chdir(bad_files)
    args = [a.format(d=bad_files) for a in args]
    if args[0] == "train" and "--preset" not in args and "--resume" not in args:
        args += ["--preset", "tiny"]
    if args[0] == "train" and "--out" not in args and "--resume" not in args:
        args += ["--out", str(bad_files / "out")]
    start = time.perf_counter()
    res = CliRunner().invoke(app, args)
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 2, (case, res.output, res.exception)
    assert len(lines) == 1 and needle in lines[0], (case, res.output)
    assert "Traceback" not in res.output and isinstance(res.exception, SystemExit)
    assert not (bad_files / "out").exists() and not (bad_files / "runs").exists()  # nothing written
    assert not (bad_files / "sw").exists()
    assert time.perf_counter() - start < 30  # no model load, no retries


def test_eval_writes_no_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["eval", "--preset", "tiny", "--max-tasks", "1", "--k", "1", "--policy", "oracle"])
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------- environment faults
class _Sleepy:
    """A lookup environment whose step never returns for the episodes its family marks."""

    def __init__(self, env, hang):
        self.env, self.hang = env, hang
        self.max_turns = env.max_turns

    def reset(self):
        return self.env.reset()

    def step(self, text):
        if self.hang == "step":
            threading.Event().wait()  # forever
        if self.hang == "crash":
            raise RuntimeError("the tool crashed")
        return self.env.step(text)

    def score(self):
        if self.hang == "score":
            threading.Event().wait()
        return self.env.score()

    def demo_action(self, rng):
        return self.env.demo_action(rng)


@pytest.fixture
def sleepy_env():
    """Registers ``sleepy``: lookup, where the first episode of each task group hangs in step, the
    second crashes in step, and the third hangs in score."""
    from seeupo.envs.base import ENVS, EnvFamily
    from seeupo.envs.lookup import LookupFamily

    class SleepyFamily(EnvFamily):
        name = "sleepy"

        def __init__(self, **options):
            self.inner = LookupFamily(**options)
            self.made = 0

        def tasks(self, split):
            return self.inner.tasks(split)

        def make(self, task, *, seed):
            k = self.made % 4
            self.made += 1
            return _Sleepy(self.inner.make(task, seed=seed), {0: "step", 1: "crash", 2: "score"}.get(k))

    ENVS["sleepy"] = SleepyFamily
    yield SleepyFamily
    del ENVS["sleepy"]


def test_environment_calls_share_a_thread_until_one_hangs():
    """Calls with a timeout run in one long-lived thread per calling thread (a thread per call was
    the slowest part of rollouts on a busy machine); a call that times out keeps its thread, and the
    next call gets a new one; exceptions reach the caller; without a timeout the call runs inline."""
    from seeupo.rollout.runner import EnvTimeout, call_with_timeout

    me = threading.current_thread  # Thread objects, kept alive here: OS thread ids are reused
    here = me()
    assert call_with_timeout(me, None, "reset") is here
    served = [call_with_timeout(me, 5.0, "step") for _ in range(5)]
    assert len(set(served)) == 1 and here not in served
    with pytest.raises(ZeroDivisionError):
        call_with_timeout(lambda: 1 / 0, 5.0, "step")
    assert call_with_timeout(me, 5.0, "step") is served[0]  # an error does not cost the thread
    release = threading.Event()
    with pytest.raises(EnvTimeout, match="step took longer than 0.2 s"):
        call_with_timeout(lambda: release.wait(30), 0.2, "step")
    after = call_with_timeout(me, 5.0, "score")
    assert after is not served[0] and after is not here  # not queued behind the hanging call
    release.set()
    other = []
    t = threading.Thread(target=lambda: other.append(call_with_timeout(me, 5.0, "step")))
    t.start()
    t.join()
    assert other and other[0] is not here and other[0] is not after  # each calling thread has its own


def test_a_hanging_tool_ends_its_episode_by_timeout(tiny, chat, sleepy_env):
    from seeupo.rollout.runner import RolloutLimits, run_episodes
    from seeupo.rollout.sampler import ScriptedPolicy

    fam = sleepy_env(n_keys=3, hops_min=1, hops_max=1)
    task = fam.tasks("train")[0]
    pol = ScriptedPolicy(lambda env, rng: env.env.oracle_action(), chat.encode, chat.eos_id)
    start = time.perf_counter()
    eps = run_episodes(pol, chat, fam, [(task, 0, s, s) for s in range(4)], RolloutLimits(3, 24, 512, env_timeout_s=0.5))
    took = time.perf_counter() - start
    assert [e.end_reason for e in eps] == ["timeout", "error", "timeout", "done"]
    assert took < 2 * 0.5 + 1.0  # two hanging calls, each ended at the timeout (plus a second in all)
    assert "step" in eps[0].error and "crashed" in eps[1].error and "score" in eps[2].error
    assert eps[3].score == 1.0 and all(e.score == 0.0 for e in eps[:3])
    assert all(e.tool_errors == 0 for e in eps)  # an environment fault is not a tool-call error


def test_run_with_hanging_tools_finishes_and_leaves_faulted_episodes_out(tmp_path, sleepy_env):
    cfg = load_config("tiny", [*SMALL[:-3], "run.iterations=1", f"run.out={tmp_path}", "env.name=sleepy",
                               "env.timeout_s=0.3", "warmup.enabled=off", "env.options={n_keys: 3}"])
    start = time.perf_counter()
    s = Trainer(cfg).run()
    assert time.perf_counter() - start < 60
    train = [r for r in _lines(tmp_path) if "reward_mean" in r]
    assert train[0]["episodes_excluded"] == 3 and s["episodes_excluded"] == 3
    assert train[0]["episode/end_timeout"] == 0.5 and train[0]["episode/end_error"] == 0.25
    assert train[0]["tool/error_rate"] <= 1.0


def test_reply_cut_at_the_context_limit_stays_within_it(tiny, chat):
    from seeupo.envs.base import make_family
    from seeupo.rollout.runner import RolloutLimits, run_episodes
    from seeupo.rollout.sampler import ScriptedPolicy

    fam = make_family("lookup", {"n_keys": 3})
    task = fam.tasks("train")[0]
    prompt = len(chat.encode(chat.render(fam.make(task, seed=0).reset(), generation_prompt=True)))
    pol = ScriptedPolicy(lambda env, rng: "x " * 200, chat.encode, chat.eos_id)
    for limit in range(prompt + 2, prompt + 12):
        ep = run_episodes(pol, chat, fam, [(task, 0, 0, 0)], RolloutLimits(4, 64, limit))[0]
        assert len(ep.ids) <= limit, (limit, len(ep.ids))


def test_rates_are_per_turn_when_reset_crashes(tiny, chat):
    from seeupo.envs.base import EnvFamily
    from seeupo.rollout.runner import RolloutLimits, run_episodes
    from seeupo.train.evaluation import episode_stats

    class Broken(EnvFamily):
        def tasks(self, split):
            from seeupo.envs.base import Task
            return [Task("t", split)]

        def make(self, task, *, seed):
            raise RuntimeError("cannot start")

    eps = run_episodes(None, chat, Broken(), [(Broken().tasks("train")[0], 0, s, s) for s in range(4)],
                       RolloutLimits(4, 8, 256))
    st = episode_stats(eps, 1.0)
    assert st["tool/error_rate"] == 0.0 and st["episode/end_error"] == 1.0


def test_faulted_episodes_leave_the_update_unchanged(tmp_path):
    """Episodes ended by their environment contribute nothing: the update on a batch with faulted
    episodes (given absurd rewards) equals the update on the batch without them."""
    import copy

    cfg = load_config("tiny", [*SMALL[:-3], "run.iterations=1", f"run.out={tmp_path}", "warmup.enabled=off",
                               "rollout.group_size=4", "algo.kl_coef=0"])
    tr = Trainer(cfg)
    episodes = tr._episodes(0)
    for i, e in enumerate(episodes):  # a random model earns nothing: give the batch a signal
        e.step_rewards = [0.0] * (e.n_turns - 1) + [float(i % 3 == 0)]
    bad = copy.deepcopy(episodes[:3])
    for i, e in enumerate(bad):
        e.end_reason, e.error, e.step_rewards, e.group = ("error", "timeout", "error")[i], "x", [100.0], episodes[0].group
    start = {n: p.detach().clone() for n, p in tr.stack.named_params}

    def run(eps):
        with torch.no_grad():
            for n, p in tr.stack.named_params:
                p.copy_(start[n])
        tr.updater.optimizer.state.clear()
        rec = tr.update(eps, 0)
        return rec, {n: p.detach().clone() for n, p in tr.stack.named_params}

    rec_a, a = run(episodes)
    rec_b, b = run(bad + episodes)
    assert rec_b["episodes_excluded"] == 3 and rec_a["episodes_excluded"] == 0
    assert rec_a["optimizer_steps"] > 0 and rec_a["advantage_abs_max"] == rec_b["advantage_abs_max"]
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert any(not torch.equal(a[n], start[n]) for n in a)


def test_a_crash_in_the_first_evaluation_keeps_the_warmup(tmp_path, monkeypatch):
    """The warmed-up model is checkpointed before the first evaluation: a run that dies there (a
    hard kill, a crash) resumes without redoing the warm-up, and ends as the uninterrupted run."""
    cfg = load_config("tiny", [*SMALL[:-3], "run.iterations=1", f"run.out={tmp_path / 'a'}"])
    ref = Trainer(cfg).run()

    def boom(self, **kw):
        raise RuntimeError("killed")
    with monkeypatch.context() as m:
        m.setattr(Trainer, "evaluate", boom)
        with pytest.raises(RuntimeError):
            Trainer(load_config("tiny", [*SMALL[:-3], "run.iterations=1", f"run.out={tmp_path / 'b'}"])).run()
    ck = checkpoint.latest(tmp_path / "b")
    assert ck is not None and json.loads((ck / "state.json").read_text())["warmup"]["warmup/steps"] == 2
    calls = []
    orig = trainer_mod.warmup
    monkeypatch.setattr(trainer_mod, "warmup", lambda *a, **kw: calls.append(1) or orig(*a, **kw))
    s = Trainer(load_config(str(tmp_path / "b" / "config.yaml")), resume=True).run()
    assert calls == [] and s["trainable_param_l2"] == ref["trainable_param_l2"]
    assert _lines(tmp_path / "b") == _lines(tmp_path / "a")


def test_a_crash_after_a_checkpoint_resumes_without_stale_lines(tmp_path, monkeypatch, uninterrupted):
    """A run that dies with lines logged past its last checkpoint (a hard kill) resumes to the
    uninterrupted run's metrics.jsonl: the lines past the checkpoint are dropped and recomputed."""
    ref_dir, ref = uninterrupted
    cfg = load_config("tiny", [*SMALL, "run.checkpoint_every=0", f"run.out={tmp_path}"])
    orig = Updater._update

    def _update(self, episodes, it):
        if it == 2:
            raise RuntimeError("killed")
        return orig(self, episodes, it)
    with monkeypatch.context() as m:
        m.setattr(Updater, "_update", _update)
        with pytest.raises(RuntimeError):
            Trainer(cfg).run()
    assert len(_lines(tmp_path)) == 4  # eval before, iterations 0 and 1, the evaluation at 2
    s = Trainer(load_config(str(tmp_path / "config.yaml")), resume=True).run()  # from the warm-up's checkpoint
    assert _lines(tmp_path) == _lines(ref_dir) and s["trainable_param_l2"] == ref["trainable_param_l2"]


def test_tool_errors_count_once_per_turn_and_extra_calls_add_up(chat):
    from seeupo.envs.base import Env, EnvFamily, StepResult, Task
    from seeupo.rollout.runner import RolloutLimits, run_episodes
    from seeupo.rollout.sampler import ScriptedPolicy
    from seeupo.train.evaluation import episode_stats

    class Noisy(Env):
        def reset(self):
            return [{"role": "user", "content": "go"}]

        def step(self, text):
            return StepResult([{"role": "user", "content": "again"}], 0.0, False, {"tool_error": 5, "extra_calls": 2})

        def score(self):
            return 0.0

    class Fam(EnvFamily):
        def tasks(self, split):
            return [Task("t", split)]

        def make(self, task, *, seed):
            return Noisy()

    pol = ScriptedPolicy(lambda env, rng: "call", chat.encode, chat.eos_id)
    eps = run_episodes(pol, chat, Fam(), [(Task("t", "train"), 0, 0, 0)], RolloutLimits(3, 8, 512))
    assert eps[0].n_turns == 3 and eps[0].tool_errors == 3 and eps[0].extra_calls == 6
    st = episode_stats(eps, 1.0)
    assert st["tool/error_rate"] == 1.0 and st["tool/extra_calls"] == 2.0


def test_a_worker_that_does_not_answer_times_out_and_is_killed(tmp_path):
    import sys

    from seeupo.envs.worker import JsonWorker, WorkerTimeout

    script = tmp_path / "w.py"
    script.write_text("import json, sys, time\nprint(json.dumps({'ok': True}), flush=True)\n"
                      "for line in sys.stdin:\n    time.sleep(600)\n")
    w = JsonWorker(sys.executable, script, name="sleepy", timeout=0.5)
    assert w.hello == {"ok": True}
    start = time.perf_counter()
    with pytest.raises(WorkerTimeout):
        w.ask("anything")
    assert time.perf_counter() - start < 1.5
    assert w.proc.wait(timeout=5) is not None  # killed
    with pytest.raises(RuntimeError, match="not running"):
        w.ask("again")
