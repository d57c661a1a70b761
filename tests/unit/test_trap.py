"""The trap family: the oracle scores 1.0, the best guessing policy scores the trap value, a vault
opened with the wrong code scores 0, splits differ, and the path counters are exact."""

import json
import random

import pytest

from seeupo.envs.base import make_family


@pytest.fixture(scope="module")
def fam():
    return make_family("trap", {"train_tasks": 64, "test_tasks": 400})


def play(fam, task, seed, actions):
    env = fam.make(task, seed=seed)
    env.reset()
    infos = []
    for act in actions:
        res = env.step(act(env) if callable(act) else act)
        infos.append(res.info)
        if res.done:
            break
    return env.score(), infos


def test_oracle_scores_one_and_best_guess_scores_the_trap_value(fam):
    tasks = fam.tasks("test")
    oracle = [play(fam, t, s, [lambda e: e.oracle_action()] * 2)[0] for s, t in enumerate(tasks)]
    assert sum(oracle) / len(oracle) == 1.0
    guess = [play(fam, t, s, [json.dumps({"tool": "guess", "key": t.data["ask"]})])[0] for s, t in enumerate(tasks)]
    assert abs(sum(guess) / len(guess) - fam.opts.guess_p) < 0.07  # 400 coins at p = 0.5


def test_the_vault_pays_only_through_the_right_code(fam):
    t = fam.tasks("train")[0]
    d = t.data
    wrong = next(c for c in d["codes"] if c != d["sealed"][d["ask"]])
    vault = json.dumps({"tool": "vault", "key": d["ask"]})
    score, infos = play(fam, t, 0, [vault, json.dumps({"tool": "open", "code": wrong})])
    assert score == 0.0 and infos[1]["count/deep"] == 0
    other = next(k for k in d["keys"] if k != d["ask"])
    code = d["sealed"][other]
    assert play(fam, t, 0, [json.dumps({"tool": "vault", "key": other}), json.dumps({"tool": "open", "code": code})])[0] == 0.0
    score, infos = play(fam, t, 0, [vault, json.dumps({"tool": "open", "code": d["sealed"][d["ask"]]})])
    assert score == 1.0 and infos[0]["count/vault"] == 1 and "count/guess" not in infos[0]
    assert infos[1]["count/deep"] == 1  # env/deep: success through the vault


def test_bandit_breaking_knobs():
    base = make_family("trap", {"train_tasks": 64, "test_tasks": 200})
    t = base.tasks("test")[0]
    d = t.data
    vault = json.dumps({"tool": "vault", "key": d["ask"]})
    # shaping: the vault of the asked key pays w at once, another key nothing; the score is unchanged
    shaped = make_family("trap", {"intermediate_reward": 0.3})
    env = shaped.make(t, seed=0)
    env.reset()
    assert env.step(vault).reward == 0.3
    env2 = shaped.make(t, seed=0)
    env2.reset()
    assert env2.step(json.dumps({"tool": "vault", "key": next(k for k in d["keys"] if k != d["ask"])})).reward == 0.0
    # noise: a distractor line, the sealed code still shown
    noisy = make_family("trap", {"observation_noise": 1.0})
    env = noisy.make(t, seed=0)
    env.reset()
    text = env.step(vault).observation[0]["content"]
    assert "yesterday" in text and d["sealed"][d["ask"]] in text.splitlines()[0]
    # a stochastic tool: vaults fail at the given rate, a third turn allows one retry; the oracle's
    # success is the chance that one of two vaults gets through
    flaky = make_family("trap", {"tool_failure": 0.5, "test_tasks": 400})
    tasks = flaky.tasks("test")
    assert flaky.make(tasks[0], seed=0).max_turns == 3
    scores = [play(flaky, task, s, [lambda e: e.oracle_action()] * 3)[0] for s, task in enumerate(tasks)]
    assert abs(sum(scores) / len(scores) - 0.75) < 0.07
    # every knob at 0: the same episodes as before the knobs existed (the coin is the first draw)
    plain = [play(base, task, s, [json.dumps({"tool": "guess", "key": task.data["ask"]})])[0]
             for s, task in enumerate(base.tasks("test"))]
    coins = [float(random.Random(s).random() < 0.5) for s in range(len(plain))]
    assert plain == coins


def test_splits_differ_and_demonstrations_are_answer_blind(fam):
    train = {json.dumps(t.data, sort_keys=True) for t in fam.tasks("train")}
    test = {json.dumps(t.data, sort_keys=True) for t in fam.tasks("test")}
    assert len(train & test) < 3  # a few coincidences among 64 x 400 small tasks at most
    rng = random.Random(0)
    scores = [play(fam, t, s, [lambda e: e.demo_action(rng)] * 2)[0] for s, t in enumerate(fam.tasks("test"))]
    # random tool, key and code: (1/2 * 1/3 * 1/2) + (1/2 * 1/3 * 1/3) = 0.139 on 3 keys and 3 codes
    assert 0.08 < sum(scores) / len(scores) < 0.2


from hypothesis import given, settings, strategies as st  # noqa: E402

FRAGMENTS = ['{"tool": "guess", "key": "red"}', '{"tool": "vault", "key": "blue"}', '{"tool": "open", "code": "amber"}',
             "{", "}", '"tool"', '"key"', '"code"', ":", ",", "red", "ivory", "\\", "\x00", "9" * 50, "[", "]"]


@settings(max_examples=150, deadline=None, database=None)
@given(st.lists(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=20), max_size=8).map("".join), min_size=2,
                max_size=2), st.integers(0, 63))
def test_trap_step_never_raises_and_counts_one_path(replies, index):
    fam = make_family("trap", {"train_tasks": 64})
    env = fam.make(fam.tasks("train")[index], seed=index)
    env.reset()
    paths = 0
    for text in replies:
        res = env.step(text)
        assert res.info["tool_error"] in (0, 1) and res.info["extra_calls"] >= 0
        paths += res.info.get("count/guess", 0) + res.info.get("count/vault", 0)
        if res.done:
            break
    assert paths <= 1 and env.score() in (0.0, 1.0)
