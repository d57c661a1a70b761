"""Turn adapters (model.turn_adapters): a LoRA adapter per turn, in the learner and in rollouts."""

import copy

import pytest
import torch

from seeupo.data.episode import derive_seed, turn_rows
from seeupo.envs import make_family
from seeupo.models.policy import apply_lora
from seeupo.models.turns import TurnAdapters, add_turn_adapters
from seeupo.rollout.runner import RolloutLimits, run_episodes
from seeupo.rollout.sampler import HFSampler
from seeupo.train.learner import LossSpec, StepInputs, optimizer_step, score

TURNS = 3


def with_adapters(tiny, spec="per_turn", scramble=False):
    m = apply_lora(copy.deepcopy(tiny.model), r=4, alpha=8, seed=0)
    ta = add_turn_adapters(m, spec, TURNS, seed=0)
    m.seeupo_turn_adapters = ta
    if scramble:  # adapters that differ from each other (LoRA's B starts at zero)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return m, ta


@pytest.fixture(scope="module")
def episodes(tiny, chat):
    fam = make_family("lookup", {"hops_min": 2, "hops_max": 2})
    sampler = HFSampler(tiny.model, pad_id=tiny.tokenizer.pad_token_id, eos_ids=[chat.eos_id], temperature=1.0)
    jobs = [(t, i, g, derive_seed(4, i, g)) for i, t in enumerate(fam.tasks("train")[:3]) for g in range(2)]
    eps = run_episodes(sampler, chat, fam, jobs, RolloutLimits(max_turns=TURNS, max_new_tokens=8))
    assert max(e.n_turns for e in eps) == TURNS
    return eps


def lora_deltas(before, model):
    """Adapter name -> largest change of its LoRA weights."""
    out = {}
    for n, p in model.named_parameters():
        if "lora_" in n:
            a = n.split(".")[-2]
            out[a] = max(out.get(a, 0.0), float((p.detach() - before[n]).abs().max()))
    return out


def sgd_step(model, rows, adv):
    params = [p for p in model.parameters() if p.requires_grad]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer_step(model, torch.optim.SGD(params, lr=1.0), params, StepInputs(rows=rows, adv=adv),
                   LossSpec("reinforce"), budget_tokens=100_000, grad_clip=None)
    return before


def test_a_turns_tokens_get_gradients_only_in_its_adapter(tiny, episodes):
    pools = turn_rows(episodes, tiny.tokenizer.pad_token_id)
    adv = torch.linspace(-1, 1, len(pools))
    for t in range(TURNS):
        m, _ = with_adapters(tiny)
        sel = torch.nonzero(pools.turn == t).squeeze(-1)
        before = sgd_step(m, pools.select(sel), adv[sel])
        moved = lora_deltas(before, m)
        assert moved[TurnAdapters.name(t)] > 0, moved
        assert all(v == 0.0 for a, v in moved.items() if a != TurnAdapters.name(t)), (t, moved)
        base = max(float((p.detach() - before[n]).abs().max()) for n, p in m.named_parameters() if "lora_" not in n)
        assert base == 0.0  # the base stays frozen under LoRA
    # all turns in one step: each adapter takes exactly its turn's share (REINFORCE's row-sum loss
    # over all rows: adapter t's step is n_t / n of its step on turn t's rows alone)
    m_all, _ = with_adapters(tiny)
    before = sgd_step(m_all, pools, adv)
    for t in range(TURNS):
        m_t, _ = with_adapters(tiny)
        sel = torch.nonzero(pools.turn == t).squeeze(-1)
        sgd_step(m_t, pools.select(sel), adv[sel])
        share = len(sel) / len(pools)
        name = TurnAdapters.name(t)
        for (n, p), (_, q) in zip(m_all.named_parameters(), m_t.named_parameters()):
            if f".{name}." in n:
                assert torch.allclose(p - before[n], (q - before[n]) * share, atol=1e-7, rtol=1e-4), n


def test_rollouts_generate_each_turn_with_its_adapter(tiny, chat):
    m, ta = with_adapters(tiny, scramble=True)
    fam = make_family("lookup", {"hops_min": 2, "hops_max": 2})
    sampler = HFSampler(m, pad_id=tiny.tokenizer.pad_token_id, eos_ids=[chat.eos_id], temperature=1.0)
    sampler.turn_adapters = ta
    jobs = [(t, i, g, derive_seed(6, i, g)) for i, t in enumerate(fam.tasks("train")[:3]) for g in range(2)]
    eps = run_episodes(sampler, chat, fam, jobs, RolloutLimits(max_turns=TURNS, max_new_tokens=8))
    pools = turn_rows(eps, tiny.tokenizer.pad_token_id)
    assert len(set(pools.turn.tolist())) >= 2
    own, _ = score(m, pools, temperature=1.0, budget_tokens=4096)  # each row under its turn's adapter
    mask = pools.loss_mask.bool()
    assert (own[mask] - pools.old_logp[mask]).abs().max() < 1e-4
    m.seeupo_turn_adapters = None  # every row under adapter 0
    ta.activate(0)
    one, _ = score(m, pools, temperature=1.0, budget_tokens=4096)
    later = mask & (pools.turn > 0).unsqueeze(-1)
    assert (one[later] - pools.old_logp[later]).abs().max() > 1e-2


def test_buckets_map_turns_to_consecutive_adapters(tiny):
    _, ta = with_adapters(tiny, "buckets:2")
    assert ta.n == 2 and [ta.of(t) for t in range(TURNS)] == [0, 0, 1]
    with pytest.raises(ValueError, match="one row per turn"):
        ta.of_rows(torch.tensor([-1, 0]))


def test_train_resume_and_evaluate_with_per_turn_adapters(tmp_path):
    """seeupo train --preset tiny --steps 2 model.turn_adapters=per_turn (shrunk), then --resume to
    3 steps (the same as 3 steps straight), then seeupo eval on the run."""
    import json

    from typer.testing import CliRunner

    from seeupo.cli import app

    small = ["warmup.episodes=16", "warmup.epochs=1", "eval.tasks=2", "eval.k=2", "rollout.tasks_per_iteration=2",
             "rollout.group_size=2", "run.loggers=[jsonl]", "run.checkpoint_every=1", "model.turn_adapters=per_turn"]
    run = CliRunner()
    for out, steps in ((tmp_path / "part", 2), (tmp_path / "full", 3)):
        res = run.invoke(app, ["train", "--preset", "tiny", "--out", str(out), "--steps", str(steps), *small])
        assert res.exit_code == 0, res.output
    res = run.invoke(app, ["train", "--resume", "--out", str(tmp_path / "part"), "--steps", "3"])
    assert res.exit_code == 0 and "resumed from" in res.output, res.output
    a, b = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("part", "full"))
    assert a["trainable_param_l2"] == pytest.approx(b["trainable_param_l2"], rel=1e-6)
    from safetensors.torch import load_file

    t = load_file(str(sorted((tmp_path / "part" / "checkpoints").glob("iter-*"))[-1] / "trainable.safetensors"))
    assert {k.split(".")[-2] for k in t if "lora_" in k} == {"default", "turn1"}  # the tiny preset's 2 turns
    res = run.invoke(app, ["eval", "--checkpoint", str(tmp_path / "part"), "--max-tasks", "2", "--k", "2"])
    assert res.exit_code == 0 and "avg@2" in res.output, res.output


def test_turn_embedding_trains_only_its_turns_vector(tiny, episodes):
    pools = turn_rows(episodes, tiny.tokenizer.pad_token_id)
    for t in range(TURNS):
        m = copy.deepcopy(tiny.model)
        ta = add_turn_adapters(m, "shared", TURNS, embedding=True)
        m.seeupo_turn_adapters = ta
        sel = torch.nonzero(pools.turn == t).squeeze(-1)
        before = sgd_step(m, pools.select(sel), torch.linspace(-1, 1, len(sel)))
        moved = (m.seeupo_turn_embedding.detach() - before["seeupo_turn_embedding"]).abs().amax(-1)
        assert moved[t] > 0 and all(moved[s] == 0 for s in range(TURNS) if s != t), (t, moved)
    # a vector changes what its turn's forward computes (and nothing else's)
    with torch.no_grad():
        m.seeupo_turn_embedding.zero_()
        m.seeupo_turn_embedding[1] = torch.randn(m.seeupo_turn_embedding.shape[1])
    a, _ = score(m, pools, temperature=1.0, budget_tokens=4096)
    m.seeupo_turn_embedding.data.zero_()
    b, _ = score(m, pools, temperature=1.0, budget_tokens=4096)
    mask = pools.loss_mask.bool()
    for t in range(TURNS):
        gap = (a - b)[mask & (pools.turn == t).unsqueeze(-1)].abs().max()
        assert (gap > 1e-3) if t == 1 else (gap == 0), (t, gap)


def test_train_with_a_turn_embedding(tmp_path):
    from seeupo.train.config import load_config
    from seeupo.train.trainer import Trainer

    cfg = load_config("tiny", ["warmup.episodes=16", "warmup.epochs=1", "eval.tasks=2", "eval.k=2",
                               "rollout.tasks_per_iteration=2", "rollout.group_size=2", "run.loggers=[jsonl]",
                               "run.iterations=2", "model.turn_embedding=true", f"run.out={tmp_path}"])
    tr = Trainer(cfg)
    tr.run()
    vec = tr.stack.model.seeupo_turn_embedding
    assert any(p is vec for p in tr.stack.params) and any(p is vec for g in tr.updater.optimizer.param_groups for p in g["params"])
    from safetensors.torch import load_file

    saved = load_file(str(sorted((tmp_path / "checkpoints").glob("iter-*"))[-1] / "trainable.safetensors"))
    assert torch.equal(saved["seeupo_turn_embedding"], vec.detach())


class _RecordingWorker:
    """Stands in for the vLLM worker process (our own JSON protocol), recording what it is asked."""

    def __init__(self):
        self.calls = []

    def ask(self, op, **kw):
        self.calls.append((op, kw))
        return {"samples": [{"ids": [1], "logp": [0.0], "finished": True}]} if op == "generate" else {}


def test_vllm_serves_each_turn_its_own_adapter_folder(tiny, tmp_path):
    from safetensors.torch import load_file

    from seeupo.rollout.vllm_backend import VLLMSampler

    m, ta = with_adapters(tiny, scramble=True)
    s = VLLMSampler.__new__(VLLMSampler)  # the engine side is vLLM's; here: what we hand it
    s.model, s.workdir, s.lora_rank, s.base_dir, s.seed = m, tmp_path, 4, str(tmp_path), 0
    s.max_model_len, s.memory_utilization, s.temperature, s.eos_ids = 64, 0.1, 1.0, [0]
    s.worker, s._synced, s._lora_id, s._engine_dir, s._loras, s._turn_adapter = _RecordingWorker(), None, 0, None, [], 0
    s.turn_adapters = ta
    s.sync(1)
    assert s.worker.calls[0][1]["max_loras"] == TURNS
    served = []
    for turn in range(TURNS):
        s.begin_turn(turn)
        s.generate([[1, 2]], [torch.Generator().manual_seed(0)], [4])
        served.append(s.worker.calls[-1][1]["lora"])
    assert len({d["id"] for d in served}) == TURNS and len({d["path"] for d in served}) == TURNS
    for turn, lora in enumerate(served):  # the folder holds exactly that turn's adapter weights
        saved = load_file(f"{lora['path']}/adapter_model.safetensors")
        name = TurnAdapters.name(turn)
        mine = {n: p for n, p in m.named_parameters() if f".{name}." in n and "lora_B" in n}
        assert len(saved) > 0 and len(mine) > 0
        for n, p in mine.items():
            assert torch.equal(saved[n.replace(f".{name}", "")], p.detach()), (turn, n)
    s.sync(2)  # a new version: new ids, the old folders go after the next one
    assert {d["id"] for d in s._loras}.isdisjoint(d["id"] for d in served)
