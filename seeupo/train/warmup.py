"""Format warm-up: a short supervised stage on environment-generated demonstrations.

The demonstrations come from the environment's ``demo_action``: format-correct tool calls whose
tools and arguments are chosen without knowing the answer, so they teach the call format, not the
solution. They run through the same episode runner as RL (same chat-template bookkeeping), and the
loss is the mean negative log-likelihood of the demonstrated assistant tokens.
"""

from __future__ import annotations

import random

import torch

from seeupo.data.episode import derive_seed, trajectory_rows, turn_rows
from seeupo.models.policy import token_logprobs
from seeupo.rollout.runner import run_episodes
from seeupo.rollout.sampler import ScriptedPolicy
from seeupo.train import parallel
from seeupo.train.learner import adamw, adapter, model_device, planned_micro_batches, sharing, turn_adapters_of


def demonstrations(chat, family, limits, *, n: int, seed: int):
    tasks = family.tasks("train")
    rng = random.Random(derive_seed(seed, "warmup-tasks"))
    jobs = [(rng.choice(tasks), i, 0, derive_seed(seed, "warmup", i)) for i in range(n)]
    policy = ScriptedPolicy(lambda env, r: env.demo_action(r), chat.encode, chat.eos_id)
    return run_episodes(policy, chat, family, jobs, limits)


def warmup(model, params, chat, family, limits, cfg, *, seed: int, budget_tokens: int, pack: int = 0,
           share: bool = False, by_adapter: bool = True, progress=None) -> dict:
    """Supervised steps on demonstrations; returns the mean loss of the first and last steps.
    ``by_adapter=False``: a model with turn adapters trains as it is (its active adapter), one row per
    episode."""
    episodes = demonstrations(chat, family, limits, n=cfg.episodes, seed=seed)
    # with turn adapters each turn trains its own adapter: one row per turn (the same tokens and loss)
    per_turn = by_adapter and turn_adapters_of(model) is not None
    share = sharing(share)
    rows = (turn_rows if per_turn else trajectory_rows)(episodes, chat.tok.pad_token_id)
    opt = adamw(params, cfg.lr)
    gen = torch.Generator().manual_seed(derive_seed(seed, "warmup-order"))
    steps = cfg.epochs * -(-len(episodes) // cfg.batch_episodes)
    if cfg.lr_schedule == "linear":  # ends at lr / steps: the last steps settle the format
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 - k / steps)
    else:
        sched = None
    losses = []
    model.train()
    for _ in range(cfg.epochs):
        perm = torch.randperm(len(episodes), generator=gen)
        for chunk in perm.split(cfg.batch_episodes):
            batch = rows.select(torch.nonzero(torch.isin(rows.episode, chunk)).squeeze(-1) if per_turn else chunk)
            n_tok = float(batch.loss_mask.sum())
            opt.zero_grad(set_to_none=True)
            total = 0.0
            grads = parallel.GradAccumulator(params)
            for (idx, a), real in parallel.mine_padded(planned_micro_batches(model, batch, budget_tokens, pack, share, per_turn)):
                mb = batch.select(idx).to(model_device(model))
                with adapter(model, a):
                    s = token_logprobs(model, mb.input_ids, mb.attention_mask, mb.loss_mask, with_entropy=False,
                                       pack=pack, share=share)
                loss = -(s.logp * mb.loss_mask).sum() / n_tok * (1.0 if real else 0.0)
                loss.backward()
                grads.add()
                total += loss.item()
            grads.finish()
            total = parallel.reduce_scalars({"loss": total})["loss"]
            parallel.clip_grad_norm_(params, 1.0)
            opt.step()
            if sched is not None:
                sched.step()
            losses.append(total)
            if progress:
                progress(total)
    opt.zero_grad(set_to_none=True)
    return {"warmup/steps": len(losses), "warmup/loss_first": losses[0] if losses else 0.0,
            "warmup/loss_last": losses[-1] if losses else 0.0,
            "warmup/demo_success": sum(e.score for e in episodes) / max(len(episodes), 1)}
