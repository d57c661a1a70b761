"""Rollout bookkeeping with scripted policies and a tiny random model."""

import json


from seeupo.data.episode import derive_seed, trajectory_rows, turn_rows
from seeupo.envs import make_family
from seeupo.rollout.runner import RolloutLimits, run_episodes
from seeupo.rollout.sampler import HFSampler, ScriptedPolicy
from seeupo.train.learner import score


def scripted(chat, fn):
    return ScriptedPolicy(fn, chat.encode, chat.eos_id)


def jobs(tasks, seed=0):
    return [(t, i, 0, derive_seed(seed, t.id)) for i, t in enumerate(tasks)]


def test_scripted_policy_exact_counts(chat):
    fam = make_family("lookup", {"hops_min": 2, "hops_max": 2, "slack_turns": 1})
    tasks = fam.tasks("test")[:5]
    state = {}

    def bad_then_oracle(env, rng):  # turn 0: malformed; turn 1: unknown tool; then the oracle
        n = state.setdefault(id(env), 0)
        state[id(env)] = n + 1
        return ["{not json", json.dumps({"tool": "search"}), env.oracle_action()][min(n, 2)]

    eps = run_episodes(scripted(chat, bad_then_oracle), chat, fam, jobs(tasks), RolloutLimits(max_turns=10))
    for e in eps:  # hops 2 + answer + slack 1 = 4 turns: 2 errors, then 2 lookups; no answer in time
        assert e.n_turns == 4 and e.tool_errors == 2 and e.end_reason == "max_turns" and e.score == 0.0
    eps = run_episodes(scripted(chat, lambda env, rng: env.oracle_action()), chat, fam, jobs(tasks), RolloutLimits())
    for e in eps:
        assert e.n_turns == 3 and e.tool_errors == 0 and e.end_reason == "done" and e.score == 1.0
        assert e.step_rewards == [0.0, 0.0, 1.0] and e.prefix_mismatches == 0
    eps = run_episodes(scripted(chat, lambda env, rng: "no call here"), chat, fam, jobs(tasks),
                       RolloutLimits(max_turns=2))
    assert all(e.n_turns == 2 and e.tool_errors == 2 and e.end_reason == "max_turns" for e in eps)


def test_context_limit_and_env_failure_are_recorded(chat):
    fam = make_family("lookup")
    tasks = fam.tasks("test")[:2]
    eps = run_episodes(scripted(chat, lambda env, rng: "x" * 50), chat, fam, jobs(tasks),
                       RolloutLimits(max_turns=4, max_new_tokens=200, max_context=200))
    assert all(e.end_reason == "context" and len(e.ids) <= 200 for e in eps)

    def boom(env, rng):
        env.step = None  # the environment breaks: calling it raises
        return "{}"

    eps = run_episodes(scripted(chat, boom), chat, fam, jobs(tasks), RolloutLimits())
    assert all(e.end_reason == "error" and e.error for e in eps)


def test_ids_trained_on_are_the_ids_sampled_and_logprobs_match(tiny, chat):
    fam = make_family("lookup")
    tasks = fam.tasks("train")[:4]
    sampler = HFSampler(tiny.model, pad_id=tiny.tokenizer.pad_token_id, eos_ids=[chat.eos_id], temperature=1.0)
    recorded = []
    original = sampler.generate

    def recording(prompts, gens, max_new):
        out = original(prompts, gens, max_new)
        recorded.append(out)
        return out

    sampler.generate = recording
    eps = run_episodes(sampler, chat, fam, [(t, i, g, derive_seed(1, i, g)) for i, t in enumerate(tasks)
                                             for g in range(2)], RolloutLimits(max_turns=3, max_new_tokens=12))
    # per episode, the sampled ids of every turn, in order
    sampled = {i: [] for i in range(len(eps))}
    live = list(range(len(eps)))
    for turn_out in recorded:
        live = [i for i in range(len(eps)) if eps[i].n_turns > len([t for t in sampled[i]])][:len(turn_out)]
        for i, s in zip(live, turn_out):
            sampled[i].append(s.ids)
    rows = trajectory_rows(eps, tiny.tokenizer.pad_token_id)
    for i, e in enumerate(eps):
        trained = rows.input_ids[i][rows.loss_mask[i].bool()].tolist()
        assert trained == [tok for ids in sampled[i] for tok in ids]
        assert sum(e.gen_mask) == sum(len(x) for x in sampled[i])
    logp, _ = score(tiny.model, rows, temperature=1.0, budget_tokens=1024)
    m = rows.loss_mask.bool()
    assert (logp[m] - rows.old_logp[m]).abs().max() < 1e-4
    # turn rows carry the same ids and masks, cut at each turn's end
    pools = turn_rows(eps, tiny.tokenizer.pad_token_id)
    assert int(pools.loss_mask.sum()) == int(rows.loss_mask.sum())


def test_episode_tokens_do_not_depend_on_batch_composition(tiny, chat):
    fam = make_family("lookup")
    tasks = fam.tasks("train")[:6]
    sampler = HFSampler(tiny.model, pad_id=tiny.tokenizer.pad_token_id, eos_ids=[chat.eos_id], temperature=1.0)
    limits = RolloutLimits(max_turns=2, max_new_tokens=10)
    all_jobs = [(t, i, 0, derive_seed(7, t.id)) for i, t in enumerate(tasks)]
    together = run_episodes(sampler, chat, fam, all_jobs, limits)
    alone = run_episodes(sampler, chat, fam, all_jobs[3:4], limits)[0]
    assert together[3].ids == alone.ids


def test_prefix_cache_prefills_only_new_tokens_and_samples_the_same(tiny, chat):
    fam = make_family("lookup", {"hops_min": 2, "hops_max": 3})
    tasks = fam.tasks("train")[:4]
    jobs = [(t, i, g, derive_seed(5, i, g)) for i, t in enumerate(tasks) for g in range(2)]
    limits = RolloutLimits(max_turns=3, max_new_tokens=12)
    runs = {}
    for on in (False, True):
        sampler = HFSampler(tiny.model, pad_id=tiny.tokenizer.pad_token_id, eos_ids=[chat.eos_id],
                            temperature=1.0, batch_size=3, prefix_cache=on)  # several batches per turn
        runs[on] = (run_episodes(sampler, chat, fam, jobs, limits), sampler)
        assert sampler._prefixes == {}  # dropped when the episodes are over
    (plain, s_plain), (cached, s_cached) = runs[False], runs[True]
    assert sum(e.n_turns for e in cached) > len(cached)  # later turns happened, so prefixes were reused
    assert s_cached.prefilled_tokens < s_plain.prefilled_tokens
    same = [a for a, b in zip(plain, cached) if a.ids == b.ids]
    assert len(same) >= len(plain) - 1  # rounding may flip a rare draw; the streams are the same
    for a, b in zip(plain, cached):
        if a.ids == b.ids:
            assert max(abs(x - y) for x, y in zip(a.logp, b.logp)) < 1e-4
    # and the learner agrees with the cached sampler's log-probs
    rows = trajectory_rows(cached, tiny.tokenizer.pad_token_id)
    logp, _ = score(tiny.model, rows, temperature=1.0, budget_tokens=1024)
    m = rows.loss_mask.bool()
    assert (logp[m] - rows.old_logp[m]).abs().max() < 1e-4


def test_a_groups_identical_prompts_prefill_once_and_sample_as_alone(tiny, chat):
    fam = make_family("lookup")
    tasks = fam.tasks("train")[:2]
    jobs = [(t, i, g, derive_seed(9, i, g)) for i, t in enumerate(tasks) for g in range(3)]
    limits = RolloutLimits(max_turns=1, max_new_tokens=10)
    sampler = HFSampler(tiny.model, pad_id=tiny.tokenizer.pad_token_id, eos_ids=[chat.eos_id], temperature=1.0)
    together = run_episodes(sampler, chat, fam, jobs, limits)
    prompt = [e.gen_mask.index(1) for e in together]  # the tokens before the first sampled one
    assert sampler.prefilled_tokens == prompt[0] + prompt[3]  # one pre-fill per distinct prompt
    assert len({tuple(e.ids) for e in together}) > 2  # the samples of a group still differ
    for k, job in enumerate(jobs):
        alone = HFSampler(tiny.model, pad_id=tiny.tokenizer.pad_token_id, eos_ids=[chat.eos_id], temperature=1.0)
        e = run_episodes(alone, chat, fam, [job], limits)[0]
        assert e.ids == together[k].ids
        assert max(abs(x - y) for x, y in zip(e.logp, together[k].logp)) < 1e-4


def test_warmup_demonstrations_come_from_training_tasks_only_and_the_oracle_solves_them(chat):
    """Every task that reaches the warm-up is a train-split task, for both sources (a test-split
    task in the warm-up would leak the held-out answers into the model); the full expert solves each
    lookup task and the format-only demonstrations almost never do; with oracle_prob 0.5 about half
    the episodes are the expert's, whole."""
    from seeupo.train.warmup import demonstrations

    fam = make_family("lookup", {})
    made = []
    real = fam.make

    def make(task, *, seed):
        made.append(task)
        return real(task, seed=seed)

    fam.make = make
    limits = RolloutLimits(max_turns=4, max_new_tokens=64)
    test_ids = {t.id for t in fam.tasks("test")}
    rates = {}
    for source, p in (("demo", 1.0), ("oracle", 1.0), ("oracle", 0.5)):
        made.clear()
        eps = demonstrations(chat, fam, limits, n=64, seed=3, source=source, oracle_prob=p)
        assert made and all(t.split == "train" and t.id not in test_ids for t in made), {t.split for t in made}
        rates[source, p] = sum(e.score for e in eps) / len(eps)
    assert rates["oracle", 1.0] == 1.0
    assert rates["demo", 1.0] < 0.2 and 0.35 < rates["oracle", 0.5] < 0.75, rates


def test_bounded_turn_contexts_render_each_prompt_from_the_task_and_the_last_exchanges(chat):
    """rollout.history=last:K: turn t's row is the template's rendering of the environment's first
    messages plus the last K exchanges (K=0: the current observation), then the turn's sampled ids;
    a turn row is that segment, and the sequence of rows holds every reply exactly once."""
    fam = make_family("lookup", {"hops_min": 3, "hops_max": 3})
    tasks = fam.tasks("test")[:3]
    full = run_episodes(scripted(chat, lambda env, rng: env.oracle_action()), chat, fam, jobs(tasks), RolloutLimits())
    for k in (0, 1, 2):
        eps = run_episodes(scripted(chat, lambda env, rng: env.oracle_action()), chat, fam, jobs(tasks),
                           RolloutLimits(history=k))
        for e, f in zip(eps, full):
            assert e.n_turns == f.n_turns == 4 and e.score == 1.0 and e.texts == f.texts and e.segmented
            env = fam.make(fam.tasks("test")[[t.id for t in tasks].index(e.task_id)], seed=0)
            initial = env.reset()
            exchanges = []
            rows = turn_rows([e], 0)
            for t in range(e.n_turns):
                recent = [m for ex in exchanges[-k:] for m in ex] if k else (exchanges[-1][1:] if exchanges else [])
                prompt = chat.encode(chat.render(initial + recent, generation_prompt=True))
                row = rows.input_ids[t, : int(rows.attention_mask[t].sum())].tolist()
                reply = chat.encode(e.texts[t]) + [chat.eos_id]
                assert row == prompt + reply, (k, t)
                assert rows.loss_mask[t].sum() == len(reply)
                res = env.step(e.texts[t])
                exchanges.append([{"role": "assistant", "content": e.texts[t]}] + res.observation)
            # the last turn's row is shorter than the whole transcript's
            assert rows.attention_mask[-1].sum() < f.turn_ends[-1]
        try:
            trajectory_rows(eps, 0)
        except ValueError as err:
            assert "algo.rows=turn" in str(err)
        else:
            raise AssertionError("segmented episodes gave trajectory rows")


def test_each_turn_records_the_anchor_state_it_started_from(chat):
    """GiGPO's anchor states: per turn, the key of the environment's messages before it (the task for
    turn 0, then the previous step's observation). Two episodes of one task share turn 0's anchor; the
    same call gives the same observation and so the same next anchor; a different call, a different one."""
    from seeupo.data.episode import anchor_key

    fam = make_family("lookup", {"hops_min": 2, "hops_max": 2})
    task = fam.tasks("train")[0]
    turn, env_index, orig = {}, {}, fam.make

    def policy(env, rng):  # the oracle, but the third episode's first reply is not a call
        k = turn.setdefault(id(env), 0)
        turn[id(env)] = k + 1
        return "no call here" if k == 0 and env_index[id(env)] == 2 else env.oracle_action()

    def make(t, *, seed):
        env = orig(t, seed=seed)
        env_index[id(env)] = len(env_index)
        return env

    fam.make = make
    eps = run_episodes(scripted(chat, policy), chat, fam, [(task, 0, i, 7) for i in range(3)], RolloutLimits(max_turns=4))
    a, b, c = (e.anchors for e in eps)
    assert all(len(e.anchors) == e.n_turns for e in eps) and len(a) == 3
    assert a[0] == b[0] == c[0] == anchor_key(fam.make(task, seed=0).reset())  # the task's prompt
    assert a[:3] == b[:3]  # the same calls, the same observations
    assert c[1] != a[1]  # an error message is another state
    assert len(set(a)) == 3
    assert eps[0].first_turns(2).anchors == a[:2]  # a cut episode keeps its turns' anchors only


def test_an_environment_may_key_anchors_on_its_own_state(chat):
    """An environment whose ``anchor_state`` returns a key (TextWorld's ``anchor: state``) names each
    turn's anchor with it; one that returns None leaves the key of its observation (issue 59)."""
    from seeupo.data.episode import anchor_key

    fam = make_family("lookup", {"hops_min": 2, "hops_max": 2})
    task = fam.tasks("train")[0]
    orig, steps, made = fam.make, {}, []

    def make(t, *, seed):
        env = orig(t, seed=seed)
        made.append(seed)
        first = len(made) == 1  # the first episode's environment keys on its own state
        env.anchor_state = lambda env=env: 1000 + steps.get(id(env), 0) if first else None
        step = env.step

        def counted(text, env=env):
            steps[id(env)] = steps.get(id(env), 0) + 1
            return step(text)
        env.step = counted
        return env

    fam.make = make
    own, plain = run_episodes(scripted(chat, lambda env, rng: env.oracle_action()), chat, fam,
                              [(task, 0, 0, 0), (task, 0, 1, 1)], RolloutLimits(max_turns=4))
    assert own.anchors == [1000 + t for t in range(own.n_turns)]
    assert plain.anchors[0] == anchor_key(orig(task, seed=made[1]).reset())
