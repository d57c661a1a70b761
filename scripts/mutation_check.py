"""Tests that can fail: break each property on purpose, run the tests that name it, expect a
failure, restore the file.

    python scripts/mutation_check.py             # every mutation (about two minutes on 2 cores)
    python scripts/mutation_check.py factor      # those whose name contains "factor"

Prints CAUGHT or MISSED per mutation; a MISSED line is a test that cannot fail. Each mutation names
the exact text it replaces, so a refactor that moves that text fails here loudly (assert)."""
import os
import subprocess
import sys

os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
M = [
 ("factor not applied", "seeupo/train/update.py", "        f_rows = factor[rows.episode]\n", "        f_rows = torch.ones_like(factor[rows.episode])\n",
  "tests/integration/test_reference.py -k 'matches and sampling-geometric-None'"),
 ("full weight computed as mean", "seeupo/core/schedule.py", 'if kind == "full":\n        return masked_sum(', 'if kind == "full":\n        return masked_mean(',
  "tests/integration/test_reference.py -k 'matches and full' tests/unit/test_schedule.py"),
 ("incremental reference not recomputed", "seeupo/train/update.py", 'if ratio_reference == "incremental":', 'if ratio_reference == "never":',
  "tests/integration/test_reference.py -k 'incremental'"),
 ("from_end ignored", "seeupo/core/schedule.py", 'in_time = ts if alignment == "from_start" else ts[::-1]', 'in_time = ts',
  "tests/integration/test_driver.py -k alignment"),
 ("absent turns not skipped", "seeupo/core/schedule.py", "return [[t] for t in custom if t in ts]", "return [[t] for t in custom]",
  "tests/integration/test_driver.py -k custom"),
 ("advantage_clip ignored", "seeupo/train/trainer.py", "            if cfg.algo.advantage_clip:\n", "            if False:\n",
  "tests/integration/test_driver.py -k advantage_clip"),
 ("random order not fresh", "seeupo/train/trainer.py", 'derive_seed(cfg.run.seed, "update", it)', 'derive_seed(cfg.run.seed, "update", 0)',
  "tests/integration/test_driver.py -k random_order"),
 ("pass@k = avg@k", "seeupo/core/metrics.py", "return float((success_TK > 0).any(-1).float().mean())", "return float(success_TK.float().mean())",
  "tests/integration/test_eval_cli.py -k avg_and"),
 ("joint algorithms carry the factor", "seeupo/train/trainer.py", "carry_factor=carries_factor(algo, cfg.algo.factor_ratio),", "carry_factor=True,",
  "tests/integration/test_driver.py -k only_sequential"),
 ("turns minibatches = 1", "seeupo/core/algorithms.py", "return max(1, n_turns) if self.minibatches == TURNS else int(self.minibatches)", "return 1 if self.minibatches == TURNS else int(self.minibatches)",
  "tests/integration/test_driver.py -k matched"),
 ("factor weight inverted", "seeupo/core/schedule.py", "ratio = torch.exp(seq_log_ratio_R.detach().to(factor_E.dtype))", "ratio = torch.exp(-seq_log_ratio_R.detach().to(factor_E.dtype))",
  "tests/integration/test_reference.py -k later_phase"),
 ("placeholders keep their advantage", "seeupo/train/update.py", "a_rows = torch.where(rows.placeholder, torch.zeros_like(a_rows), a_rows)", "a_rows = a_rows",
  "tests/integration/test_learner.py -k placeholder"),
 ("a preset's schedule leaks to other algorithms", "seeupo/train/config.py", "_symmetric_clip([(_schedule_key(k, str(name)), v) for k, v in _flatten(tree)])",
  "_symmetric_clip([(k, v) for k, v in _flatten(tree)])",
  "tests/integration/test_driver.py -k leaves_the_others"),
 ("lab carries the factor for every algorithm", "seeupo/lab/runner.py", "carry = carries_factor(algo, cfg.factor_ratio)", "carry = cfg.factor_ratio != 'off'",
  "tests/unit/test_lab.py"),
 ("fused factor pass ignores factor_ratio", "seeupo/train/learner.py", "cont.score_mask, inp.factor_ratio)", 'cont.score_mask, "geometric")',
  "tests/integration/test_reference.py -k 'reverse-sampling-full'"),
 ("window drops the joint rest phase", "seeupo/core/schedule.py", "return [[t] for t in reversed(tail)] + ([sorted(rest)] if rest else [])", "return [[t] for t in reversed(tail)]",
  "tests/integration/test_driver.py -k window tests/unit/test_schedule.py"),
 ("placeholders with an empty mask (the old no-op)", "seeupo/data/episode.py", "out.append((e.ids[:end], mask, e.logp[:end], i, t, [-1] * end))", "out.append((e.ids[:end], [0] * end, e.logp[:end], i, t, [-1] * end))",
  "tests/integration/test_learner.py -k placeholder"),
 ("placeholders left out of the row mean", "seeupo/train/learner.py", "real_rows = float((rows.loss_mask.sum(-1) > 0).sum())",
  "real_rows = float(((rows.loss_mask.sum(-1) > 0) & (torch.zeros(len(rows), dtype=torch.bool) if rows.placeholder is None else ~rows.placeholder)).sum())",
  "tests/integration/test_learner.py -k placeholder"),
 ("a low side alone keeps the declared high side", "seeupo/train/config.py", '            fields["clip_eps_high"] = None  # a range set by its low side alone is symmetric\n', "            pass\n",
  "tests/unit/test_config.py"),
 ("minibatches chunked into fewer than asked", "seeupo/train/update.py", "torch.tensor_split(perm, min(ctx.minibatches, n))", "perm.chunk(min(ctx.minibatches, n))",
  "tests/integration/test_driver.py -k exactly"),
 # reliability (tests/integration/test_reliability.py)
 ("non-finite step applied", "seeupo/train/learner.py", "    if finite:\n        optimizer.step()", "    if True:\n        optimizer.step()",
  "tests/integration/test_reliability.py -k 'guard or nonfinite'"),
 ("NaN diagnostic hidden by max", "seeupo/train/learner.py", 'nan_max(sums["logp_gap_max"], float(gap))', 'max(sums["logp_gap_max"], float(gap))',
  "tests/integration/test_reliability.py -k nonfinite_temperature"),
 ("resumed log keeps stale lines", "seeupo/train/runlog.py", "keep = lines[:resume_lines]", "keep = lines",
  "tests/integration/test_reliability.py -k crash_after"),
 ("warm-up not checkpointed before the first evaluation", "seeupo/train/trainer.py", "                        self._save(0)  # the warmed-up model", "                        pass  # the warmed-up model",
  "tests/integration/test_reliability.py -k crash_in_the_first"),
 ("a stop lands inside the update", "seeupo/train/trainer.py", "on_progress=self._stopper())  # a stop before the update", "on_progress=None)  # a stop before the update",
  "tests/integration/test_reliability.py -k 'sigterm_then and rollout'"),
 ("second signal ignored", "seeupo/train/trainer.py", "        if self.signum is not None:\n            raise KeyboardInterrupt", "        if self.signum is not None:\n            return",
  "tests/integration/test_reliability.py -k second_signal"),
 ("stale checkpoint temporaries kept", "seeupo/train/checkpoint.py", "        return None\n    clean_temporaries(folder / \"checkpoints\")", "        return None",
  "tests/integration/test_reliability.py -k killed_checkpoint"),
 ("pruning by name", "seeupo/train/checkpoint.py", "_run_id(p) == run_id), key=_iteration)", "_run_id(p) == run_id), key=lambda p: p.name)",
  "tests/integration/test_reliability.py -k pruning"),
 ("a finished run clobbered", "seeupo/train/checkpoint.py", "    if not overwrite:\n        refuse_existing(folder)", "    if False:\n        refuse_existing(folder)",
  "tests/integration/test_reliability.py -k 'rerun or resume_without'"),
 ("timeouts reported as crashes", "seeupo/rollout/runner.py", 'ep.end_reason = "timeout" if isinstance(e, TimeoutError) else "error"', 'ep.end_reason = "error"',
  "tests/integration/test_reliability.py -k hanging"),
 ("faulted episodes trained on", "seeupo/train/trainer.py", "        episodes = [e for e in episodes if not e.faulted]\n", "        episodes = list(episodes)\n",
  "tests/integration/test_reliability.py -k faulted"),
 ("tool errors not capped per turn", "seeupo/rollout/runner.py", 'ep.tool_errors += min(1, int(res.info.get("tool_error", 0)))', 'ep.tool_errors += int(res.info.get("tool_error", 0))',
  "tests/integration/test_reliability.py -k once_per_turn"),
 ("context budget without room for the closing token", "seeupo/rollout/runner.py", "limits.max_context - len(lv.ep.ids) - 1)", "limits.max_context - len(lv.ep.ids))",
  "tests/integration/test_reliability.py -k context_limit"),
 ("YAML errors as tracebacks", "seeupo/train/config.py", "    except yaml.YAMLError as e:\n        mark", "    except ImportError as e:\n        mark",
  "tests/integration/test_reliability.py -k bad_input"),
 ("model checked only when loading", "seeupo/train/trainer.py", "    try:\n        check_model(cfg.model.name)", "    try:\n        pass",
  "tests/integration/test_reliability.py -k bad_input"),
 # experiments (issue 15)
 ("collapse without 'staying down'", "seeupo/sweep/collapse.py", "if not b), len(below))  # below to the end", "), len(below))  # below to the end",
  "tests/unit/test_collapse.py"),
 ("bootstrap at the wrong level", "seeupo/sweep/report.py", "lo = means[int((1 - level) / 2 * n)]", "lo = means[int((1 - level) * n)]",
  "tests/unit/test_collapse.py -k bootstrap"),
 ("trap guess always right", "seeupo/envs/trap.py", "return self._end(key == d[\"ask\"] and self.coin,", "return self._end(key == d[\"ask\"],",
  "tests/unit/test_trap.py"),
 ("trial threads follow the worker count", "seeupo/sweep/engine.py", '"OMP_NUM_THREADS": str(spec.trial_threads)', '"OMP_NUM_THREADS": str(spec.trial_threads * spec.workers)',
  "tests/integration/test_sweep.py -k workers"),
 ("tuning ignores its budget", "seeupo/sweep/engine.py", "if used >= budget or", "if used >= budget + 1 or",
  "tests/integration/test_sweep.py -k tuned"),
 ("gspo clip 0.2", "seeupo/core/algorithms.py", "clip_eps=3e-4, clip_eps_high=4e-4", "clip_eps=0.2, clip_eps_high=0.2",
  "tests/unit/test_schedule.py tests/unit/test_config.py tests/unit/test_lab.py"),
 # the shared-prefix forward (tests/integration/test_learner.py, test_reference.py)
 ("shared rows continue one position late", "seeupo/models/policy.py", "pos = self.starts[self.cluster].unsqueeze(1) + torch.arange(T, device=dev)",
  "pos = self.starts[self.cluster].unsqueeze(1) + 1 + torch.arange(T, device=dev)", "tests/integration/test_learner.py -k shared"),
 ("cluster segments read from the wrong cluster", "seeupo/models/policy.py", "torch.where(j < part, p0 + c * S + (j - p0),",
  "torch.where(j < part, p0 + (c + 1) % max(C, 1) * S + (j - p0),", "tests/integration/test_learner.py -k shared"),
 ("shared micro-batches over budget", "seeupo/train/learner.py", "adj[start:end - 1]) > budget_tokens:", "adj[start:end - 1]) > 4 * budget_tokens:",
  "tests/integration/test_learner.py -k shared_micro"),
 ("a group's prompt pre-filled per row", "seeupo/rollout/sampler.py", "        if len(uniq) < n:\n", "        if False:\n",
  "tests/integration/test_rollout.py -k groups"),
 ("a pre-filled prompt spread to the wrong rows", "seeupo/rollout/sampler.py", "spread = torch.tensor([where[first_of[k]] for k in keys], device=dev)",
  "spread = torch.tensor([where[first_of[k]] for k in keys][::-1], device=dev)", "tests/integration/test_rollout.py -k groups"),
 # buckets:B (tests/integration/test_reference.py)
 ("a bucket trained as per-turn rows", "seeupo/train/update.py", "        segment = segmented and len(phase) > 1\n", "        segment = False\n",
  "tests/integration/test_reference.py -k buckets"),
 ("a bucket's continuation scores only its last turn", "seeupo/train/update.py", "torch.isin(prev.token_turn[j, a:b], torch.tensor(prev_turns)).long()",
  "(prev.token_turn[j, a:b] == prev_turns[-1]).long()", "tests/integration/test_reference.py -k buckets"),
 ("a bucket's factor from its latest turn only", "seeupo/train/update.py", "rows.loss_mask = torch.isin(rows.token_turn, torch.tensor(phase)).long() * rows.attention_mask",
  "rows.loss_mask = torch.isin(rows.token_turn, torch.tensor(phase[-1:])).long() * rows.attention_mask", "tests/integration/test_reference.py -k buckets"),
 # turn adapters (tests/integration/test_turn_adapters.py)
 ("rows not split by adapter", "seeupo/train/learner.py", "    if ta is None or not by_adapter:\n", "    if True:\n",
  "tests/integration/test_turn_adapters.py -k gradients"),
 ("a turn generated under the previous turn's adapter", "seeupo/rollout/sampler.py", "            self.turn_adapters.activate(a)\n", "            pass\n",
  "tests/integration/test_turn_adapters.py -k rollouts"),
 ("a prefix cache carried across adapters", "seeupo/rollout/sampler.py", "        if a != self.turn_adapters.active:\n            self._prefixes = {}\n",
  "        if a != self.turn_adapters.active:\n", "tests/integration/test_turn_adapters.py -k rollouts"),
 ("every turn's forward gets the first turn's vector", "seeupo/models/turns.py", "out + self.embedding[self.active].to(out.dtype)",
  "out + self.embedding[0].to(out.dtype)", "tests/integration/test_turn_adapters.py -k embedding"),
 ("algo.update_turns ignored", "seeupo/train/trainer.py", '    if spec == "all":\n        return rows\n    if bool((rows.turn >= 0).all()):',
  '    if True:\n        return rows\n    if bool((rows.turn >= 0).all()):', "tests/integration/test_driver.py -k update_turns"),
 ("last:W counted from the first turn", "seeupo/core/schedule.py", "        return turn >= n_turns - k\n", "        return turn >= k\n",
  "tests/integration/test_driver.py -k update_turns"),
 ("the late third is the early one", "seeupo/sweep/turns.py", "early, late = recs[:k], recs[-k:]", "early, late = recs[:k], recs[:k]",
  "tests/unit/test_turns_report.py"),
 ("trap shaping never paid", "seeupo/envs/trap.py", 'shaping = self.opts.intermediate_reward if key == d["ask"] else 0.0',
  "shaping = 0.0", "tests/unit/test_trap.py -k knobs"),
 ("quick.arms without the reference", "seeupo/sweep/experiment.py", "if unknown or self.reference not in self.quick.arms:",
  "if unknown:", "tests/integration/test_sweep.py -k shipped"),
 ("the turn vector left out of training", "seeupo/models/turns.py",
  "vec = nn.Parameter(torch.zeros(max_turns, w.shape[1], dtype=w.dtype, device=w.device))",
  "vec = nn.Parameter(torch.zeros(max_turns, w.shape[1], dtype=w.dtype, device=w.device), requires_grad=False)",
  "tests/integration/test_turn_adapters.py -k turn_embedding"),
 ("turn adapters beyond the first not trained", "seeupo/models/turns.py", '            if "lora_" in name:\n                p.requires_grad_(True)',
  '            if "lora_" in name and ".default." in name:\n                p.requires_grad_(True)', "tests/integration/test_turn_adapters.py -k resume"),
 ("turn adapters allowed on vLLM", "seeupo/train/config.py", '            if self.rollout.backend != "hf":\n', '            if False:\n',
  "tests/unit/test_config.py"),
]
only = sys.argv[1:]
for name, path, old, new, tests in M:
    if only and not any(o in name for o in only):
        continue
    src = open(path).read()
    assert src.count(old) == 1, (name, src.count(old))
    open(path, "w").write(src.replace(old, new))
    try:
        r = subprocess.run(f"OMP_NUM_THREADS=1 {sys.executable} -m pytest -q -x {tests}", shell=True, capture_output=True, text=True)
        last = [l for l in r.stdout.splitlines() if "passed" in l or "failed" in l or "error" in l][-1:]
        print(f"{'CAUGHT' if r.returncode != 0 else 'MISSED'}  {name}: {last}", flush=True)
    finally:
        open(path, "w").write(src)
