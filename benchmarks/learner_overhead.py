"""Our learner's tokens per second against a bare PyTorch forward + backward + optimizer step on the
same batch: the practical limit on this machine.

    python benchmarks/learner_overhead.py --quick --json runs/bench/learner_overhead.json   # under 2 minutes
    python benchmarks/learner_overhead.py --json runs/bench/learner_overhead_full.json       # SmolLM2-135M + LoRA

Ours: ``Trainer.update`` of GRPO on trajectory rows without KL (advantages, micro-batching, the clipped loss, one
optimizer step). Bare: the same rows in the same micro-batches, ``model(input_ids).logits``, an
advantage-weighted log-likelihood on the generated tokens, ``backward``, ``AdamW.step``; nothing
else. Bare (sliced): the same, but the LM head applied only at the positions that predict generated
tokens (as our learner does): the tighter limit, so its ratio is our learner's own overhead. Both from the same parameters, interleaved, median of the timed rounds; tokens = real (not
padding) tokens of the rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import finish, reset, score_sampling_logp, synthetic_episodes  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, 3 timed rounds")
    ap.add_argument("--model", default=None, help="default: tiny-random:4x128 quick, smollm2-135m-instruct full")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    model_name = args.model or ("tiny-random:4x128" if args.quick else "smollm2-135m-instruct")

    from seeupo.data.episode import trajectory_rows
    from seeupo.models.policy import decoder_parts
    from seeupo.train.config import load_config
    from seeupo.train.learner import adamw, micro_batches
    from seeupo.train.trainer import Trainer

    cfg = load_config("default", [f"model.name={model_name}", f"model.lora={'false' if model_name.startswith('tiny') else 'true'}",
                                  "algo.name=grpo", "algo.rows=trajectory", "algo.minibatches=1", "algo.kl_coef=0",
                                  "warmup.enabled=off",
                                  "run.loggers=[]",
                                  "run.out=/tmp/seeupo-bench"])
    tr = Trainer(cfg)
    pad = tr.stack.tokenizer.pad_token_id
    episodes = synthetic_episodes([args.turns] * args.episodes, vocab=len(tr.stack.tokenizer))
    score_sampling_logp(tr.stack.model, episodes, pad)
    rows = trajectory_rows(episodes, pad)
    tokens = int(rows.attention_mask.sum())
    groups = micro_batches(rows, tr.stack.micro_batch_tokens)  # the learner's budget (fit_memory may lower the configured one)
    adv = torch.randn(len(rows))
    init = {n: p.detach().clone() for n, p in tr.stack.named_params}
    bare_opt = adamw(tr.stack.params, cfg.optim.lr)  # the optimizer our learner builds (fused where it can be)

    def ours() -> float:
        reset(tr, init)
        t0 = time.perf_counter()
        tr.update(episodes, 0)
        return time.perf_counter() - t0

    decoder, lm_head = decoder_parts(tr.stack.model)

    def bare(sliced: bool = False) -> float:
        reset(tr, init)
        bare_opt.state.clear()
        t0 = time.perf_counter()
        bare_opt.zero_grad(set_to_none=True)
        n_gen = float(rows.loss_mask.sum())
        for idx in groups:
            mb = rows.select(idx)
            targets, mask = mb.input_ids[:, 1:], mb.loss_mask[:, 1:]
            w = adv[idx].unsqueeze(-1).expand_as(mask)
            if sliced:
                h = decoder(input_ids=mb.input_ids, attention_mask=mb.attention_mask).last_hidden_state[:, :-1]
                sel = mask.bool()
                logits, targets, w = lm_head(h[sel]).float(), targets[sel], w[sel]
                weight = torch.ones_like(w)
            else:
                logits = tr.stack.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1].float()
                weight = mask
            logp = torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            loss = -(logp * weight * w).sum() / n_gen
            loss.backward()
        torch.nn.utils.clip_grad_norm_(tr.stack.params, 1.0)
        bare_opt.step()
        return time.perf_counter() - t0

    tr.stack.model.train()
    times = {"ours": [], "bare": [], "bare_sliced": []}
    for r in range(args.rounds + 1):  # round 0 untimed
        for name, fn in (("ours", ours), ("bare", bare), ("bare_sliced", lambda: bare(True))):
            dt = fn()
            if r:
                times[name].append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"model": model_name, "rows": len(rows), "tokens": tokens, "micro_batches": len(groups),
           "seconds_median": med, "seconds_all": times,
           "ours_tok_per_s": tokens / med["ours"], "bare_tok_per_s": tokens / med["bare"],
           "bare_sliced_tok_per_s": tokens / med["bare_sliced"],
           "ours_over_bare_throughput": med["bare"] / med["ours"],
           "ours_over_bare_sliced_throughput": med["bare_sliced"] / med["ours"]}
    print(f"{model_name}: {len(rows)} rows, {tokens} tokens, {len(groups)} micro-batches; ours "
          f"{out['ours_tok_per_s']:.0f} tok/s, bare {out['bare_tok_per_s']:.0f} tok/s, bare sliced "
          f"{out['bare_sliced_tok_per_s']:.0f} tok/s; throughput ours/bare {out['ours_over_bare_throughput']:.2f}, "
          f"ours/bare sliced {out['ours_over_bare_sliced_throughput']:.2f}")
    return finish(out, "learner_overhead.py", argv, args.json)


if __name__ == "__main__":
    main()
