"""Our GRPO against TRL's ``GRPOTrainer`` on the same single-turn setup, time per step side by side.

    pip install -e '.[bench]'          # TRL (after torch==2.13.0, so the CPU torch stays)
    python benchmarks/vs_trl.py --quick --json runs/bench/vs_trl.json   # 2 timed steps each
    python benchmarks/vs_trl.py --steps 4 --json runs/bench/vs_trl_full.json

Setup (both): SmolLM2-135M-Instruct from the local cache (the default model), LoRA r=16 alpha=32 on
the same projections, 8 prompts x 8 generations per step, at most 32 new tokens at temperature 1,
no KL term, one optimizer step per batch (TRL: ``num_iterations=1``; ours: ``epochs=1``), learning
rate 1e-4, TRL without its default activation checkpointing (``--trl-checkpointing`` keeps it), the same reward (1 if the reply contains the right sum, else 0). A step is generation +
reward + update. Each trainer runs one untimed step first; the median of the timed steps is reported.
Both run in this one process, one after the other (TRL first), with the same thread count.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import finish  # noqa: E402

PROMPTS = [(a, b) for a, b in [(12, 7), (31, 4), (8, 25), (17, 17), (40, 2), (9, 13), (26, 11), (5, 38)]]


def prompt_text(a: int, b: int) -> str:
    return f"What is {a} + {b}? Reply with the number only."


def reward(text: str, answer: int) -> float:
    return float(str(answer) in re.findall(r"-?\d+", text))


def run_trl(model_path: str, steps: int, lr: float, checkpointing: bool) -> list[float]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from seeupo.models.policy import LORA_TARGETS

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    rows = [{"prompt": [{"role": "user", "content": prompt_text(a, b)}], "answer": a + b} for a, b in PROMPTS]
    ds = Dataset.from_list(rows * (steps + 1))

    def reward_fn(completions, answer, **_):
        return [reward(c[0]["content"] if isinstance(c, list) else c, int(x)) for c, x in zip(completions, answer)]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    cfg = GRPOConfig(output_dir="/tmp/seeupo-bench-trl", per_device_train_batch_size=64, num_generations=8,
                     max_completion_length=32, learning_rate=lr, beta=0.0, num_iterations=1, temperature=1.0,
                     use_cpu=True, bf16=False, max_steps=steps + 1, logging_steps=1, save_strategy="no",
                     report_to="none", disable_tqdm=True, shuffle_dataset=False, seed=0,
                     gradient_checkpointing=checkpointing)
    present = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    trainer = GRPOTrainer(model=model, reward_funcs=reward_fn, args=cfg, train_dataset=ds, processing_class=tok,
                          peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none",
                                                 target_modules=[t for t in LORA_TARGETS if t in present]),
                          callbacks=[Timer()])
    trainer.train()
    # TRL generates at the first micro-step of a step; with one micro-step per step (64 completions
    # in one batch) the step time holds generation, reward and update
    return times[1:]


def run_ours(steps: int, lr: float) -> tuple[list[float], float]:
    from seeupo.data.episode import Episode, derive_seed
    from seeupo.train.config import load_config
    from seeupo.train.trainer import Trainer

    cfg = load_config("default", ["algo.name=grpo", "algo.epochs=1", "algo.minibatches=1", "algo.kl_coef=0", "algo.rows=trajectory",
                                  f"optim.lr={lr}", "warmup.enabled=off", "run.loggers=[]",
                                  "run.out=/tmp/seeupo-bench", "rollout.max_new_tokens=32"])
    tr = Trainer(cfg)
    prompts = [tr.stack.chat.encode(tr.stack.chat.render([{"role": "user", "content": prompt_text(a, b)}], generation_prompt=True))
               for a, b in PROMPTS]
    times, rewards = [], []
    for it in range(steps + 1):
        t0 = time.perf_counter()
        ids = [p for p in prompts for _ in range(8)]
        gens = [torch.Generator().manual_seed(derive_seed(0, it, i)) for i in range(len(ids))]
        with torch.no_grad():
            samples = tr.stack.sampler.generate(ids, gens, [32] * len(ids))
        episodes = []
        for i, (p, s) in enumerate(zip(ids, samples)):
            a, b = PROMPTS[i // 8]
            e = Episode(episode_id=i, task_id=str(i // 8), group=i // 8, sample=i % 8, seed=0)
            e.append(p)
            e.append(s.ids, turn=0, logp=s.logp)
            e.turn_ends.append(len(e.ids))
            e.step_rewards.append(reward(tr.stack.chat.decode(s.ids), a + b))
            e.end_reason = "done"
            episodes.append(e)
        tr.update(episodes, it)
        if it:
            times.append(time.perf_counter() - t0)
            rewards.append(sum(e.reward for e in episodes) / len(episodes))
    return times, sum(rewards) / max(len(rewards), 1)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 timed steps each")
    ap.add_argument("--steps", type=int, default=None, help="timed steps each (default 2 quick, 4 full)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--trl-checkpointing", action="store_true",
                    help="keep TRL's default activation checkpointing (off by default: ours does not recompute)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    steps = args.steps or (2 if args.quick else 4)
    try:
        import trl  # noqa: F401
    except ImportError:
        sys.exit("vs_trl.py needs TRL: pip install -e '.[bench]' (after torch==2.13.0)")

    from seeupo.models.loading import DEFAULT_MODEL, resolve

    trl_times = run_trl(resolve(DEFAULT_MODEL), steps, args.lr, args.trl_checkpointing)
    our_times, our_reward = run_ours(steps, args.lr)
    out = {"model": DEFAULT_MODEL, "steps": steps, "threads": torch.get_num_threads(),
           "trl_activation_checkpointing": args.trl_checkpointing,
           "trl_seconds": trl_times, "ours_seconds": our_times,
           "trl_median_s": statistics.median(trl_times), "ours_median_s": statistics.median(our_times),
           "ours_mean_reward": our_reward}
    out["ours_over_trl"] = out["ours_median_s"] / out["trl_median_s"]
    print(f"time per step (8 prompts x 8 generations, 32 new tokens, LoRA r=16): TRL {out['trl_median_s']:.2f} s, "
          f"ours {out['ours_median_s']:.2f} s, ours / TRL = {out['ours_over_trl']:.2f}")
    return finish(out, "vs_trl.py", argv, args.json)


if __name__ == "__main__":
    main()
