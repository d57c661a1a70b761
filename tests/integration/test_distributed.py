"""Scale-out computes the same thing: ``seeupo train --preset tiny --steps 2`` in 1 process and under
``torchrun --nproc_per_node 2`` (gloo, CPU) gives the same episode rewards and parameters, for SeeUPO
and GRPO with replicated (ddp) and with sharded (fsdp2) parameters; a 2-process checkpoint resumes in
1 process exactly as in 2. The default run holds SeeUPO replicated and the checkpoint; the rest is in
the slow set (``-m slow``), to keep the default run under 15 minutes on a slow 2-core machine.

Seed 2 of the tiny preset has reward variance in its second iteration, so the compared update is a
real policy-gradient step, not only the KL term.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

# the warm-up is shortened (the preset's 6 epochs double it): what is compared is the same either way
ARGS = ["train", "--preset", "tiny", "--steps", "2", "--seed", "2", "warmup.epochs=3", "run.loggers=[jsonl]"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def launch(out: Path, *extra: str, nproc: int = 1, resume_steps: int | None = None) -> None:
    if resume_steps is None:
        args = [*ARGS, "--out", str(out), *extra]
    else:
        args = ["train", "--resume", "--out", str(out), "--steps", str(resume_steps), *extra]
    if nproc == 1:
        cmd = [sys.executable, "-m", "seeupo", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "seeupo", *args]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"{' '.join(cmd)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def params(out: Path) -> dict[str, torch.Tensor]:
    last = sorted(glob.glob(str(out / "checkpoints" / "iter-*")))[-1]
    return load_file(Path(last) / "trainable.safetensors")


def assert_same_run(a: Path, b: Path) -> None:
    ma, mb = metrics(a), metrics(b)
    assert len(ma) == len(mb)
    for x, y in zip(ma, mb):
        assert x["iteration"] == y["iteration"]
        if "reward_mean" in x:  # every episode's reward enters the mean; the counts must agree too
            assert x["reward_mean"] == y["reward_mean"]
            assert x["success_rate"] == y["success_rate"]
            assert x["episode/turns"] == y["episode/turns"]
        if "eval" in x:
            assert x["eval"]["avg@k"] == y["eval"]["avg@k"]
            assert x["eval"]["reward_mean"] == y["eval"]["reward_mean"]
    pa, pb = params(a), params(b)
    assert pa.keys() == pb.keys()
    diff = max(float((pa[k] - pb[k]).abs().max()) for k in pa)
    assert diff < 1e-5, f"max abs parameter difference {diff}"
    la = json.loads((a / "summary.json").read_text())["trainable_param_l2"]
    lb = json.loads((b / "summary.json").read_text())["trainable_param_l2"]
    assert abs(la - lb) <= 1e-5 * abs(la)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """1-process runs, one per algorithm, shared by the tests."""
    runs: dict[tuple, Path] = {}

    def get(algo: str, *extra: str) -> Path:
        key = (algo, *extra)
        if key not in runs:
            runs[key] = tmp_path_factory.mktemp(f"single_{algo}")
            launch(runs[key], "--algo", algo, *extra)
            assert any(m.get("reward_mean", 0) > 0 for m in metrics(runs[key])), "no learning signal to compare"
        return runs[key]

    return get


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    """2-process (ddp) runs, one per algorithm, shared by the tests (which copy before changing them)."""
    runs: dict[str, Path] = {}

    def get(algo: str) -> Path:
        if algo not in runs:
            runs[algo] = tmp_path_factory.mktemp(f"ddp_{algo}")
            launch(runs[algo], "--algo", algo, nproc=2)
        return runs[algo]

    return get


# GRPO replicated is in the slow set too (-m slow; 4 minutes of the default run's 2 cores): the
# distributed path it takes is SeeUPO's
@pytest.mark.parametrize("algo", ["seeupo", pytest.param("grpo", marks=pytest.mark.slow)])
def test_two_processes_match_one(single, ddp, algo):
    assert_same_run(single(algo), ddp(algo))


# sharded runs are in the slow set (-m slow; SeeUPO's about 4 minutes of the default run's 2 cores,
# GRPO's 3.5): the default run keeps the replicated comparison and the checkpoint below
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["seeupo", "grpo"])
def test_fsdp2_matches_one(single, tmp_path, algo):
    # sharded processes run every row's prefix (a shared-prefix forward makes a number of decoder
    # calls that depends on the rows, and FSDP2 needs the same calls on every process): compared
    # with one process doing the same
    launch(tmp_path / "fsdp2", "--algo", algo, "parallel.strategy=fsdp2", nproc=2)
    assert_same_run(single(algo, "optim.share_prefix=false"), tmp_path / "fsdp2")


def test_two_process_checkpoint_resumes_in_one(ddp, tmp_path):
    two, one = tmp_path / "two", tmp_path / "one"
    shutil.copytree(ddp("seeupo"), two)  # test_two_processes_match_one's 2-process SeeUPO run
    shutil.copytree(two, one)
    launch(two, nproc=2, resume_steps=3)
    launch(one, nproc=1, resume_steps=3)
    assert metrics(one)[-2]["iteration"] == 2  # the continued iteration, then the final evaluation
    assert_same_run(two, one)


EXIT_CHECK = """
import atexit, sys
import torch.distributed as dist
from seeupo.train import parallel

# registered first, so it runs last at exit (atexit is last-in first-out): after seeupo's own handler
atexit.register(lambda: print(f"rank {dist.get_rank() if dist.is_initialized() else '-'} exits with the "
                              f"process group {'alive' if dist.is_initialized() else 'destroyed'}", flush=True))
parallel.init("ddp")
print(parallel.gather_ordered([parallel.rank()], parallel.world()), flush=True)
"""


def test_processes_destroy_their_group_before_the_interpreter_ends(tmp_path):
    """Left to interpreter finalization, gloo's threads can be torn down joinable: the process aborts
    (SIGABRT) after its work is done, about one 2-process launch in four on this machine. ``init``
    registers the cure; this checks that it runs, on every process, before the interpreter ends."""
    script = tmp_path / "exit_check.py"
    script.write_text(EXIT_CHECK)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        str(script)], env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("[0, 1]") == 2, p.stdout
    assert p.stdout.count("exits with the process group destroyed") == 2, p.stdout
