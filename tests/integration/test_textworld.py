"""TextWorld: games generated locally, the oracle wins them, the runner and the eval command work."""

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("textworld", reason="needs textworld: run `seeupo setup textworld`")

from seeupo.cli import app  # noqa: E402
from seeupo.envs.base import make_family  # noqa: E402
from seeupo.envs.textworld import parse_command  # noqa: E402


def test_parse_command():
    assert parse_command("  > Go North.\nthen more") == "go north"
    assert parse_command("'take key'") == "take key"
    assert parse_command("\n\n") == ""


def test_generated_games_are_deterministic_and_the_oracle_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEUPO_CACHE", str(tmp_path))
    fam = make_family("textworld", {"test_tasks": 2, "quest_length": 2})
    for task in fam.tasks("test"):
        first = fam.make(task, seed=0).reset()
        env = fam.make(task, seed=1)  # the second one reuses the compiled game
        assert env.reset() == first
        rewards, done, steps = [], False, 0
        while not done:
            res = env.step(env.oracle_action())
            rewards.append(res.reward)
            done, steps = res.done, steps + 1
            assert res.info["tool_error"] == 0
        assert env.score() == 1.0 and abs(sum(rewards) - 1.0) < 1e-9 and steps <= 2 * 2
    assert len(list((tmp_path / "textworld").rglob("*.z8"))) == 2


def test_bad_commands_are_counted_not_fatal(tmp_path, monkeypatch):
    """A reply without a command is a format error (tool_error, what the health warning watches); a
    well-formed command the game does not accept is a wrong move, counted apart (issue 59: the warning
    read every wrong move on TextWorld as a broken call format)."""
    monkeypatch.setenv("SEEUPO_CACHE", str(tmp_path))
    fam = make_family("textworld", {"test_tasks": 1, "quest_length": 2})
    assert set(fam.counters) == {"inadmissible", "meta_command"}
    env = fam.make(fam.tasks("test")[0], seed=0)
    env.reset()
    for text, fmt, wrong in (("", 1, 0), ("  \n ", 1, 0), ("fly to the moon", 0, 1), ("xyzzy", 0, 1), ("save", 0, 1),
                             (env.oracle_action(), 0, 0)):
        res = env.step(text)
        assert res.info["tool_error"] == fmt and res.info.get("count/inadmissible", 0) == wrong, text
        assert res.observation or res.done
    assert env.score() in (0.0, 1.0)


def test_anchor_state_keys_on_the_game_facts(tmp_path, monkeypatch):
    """anchor: state keys a turn on the game's facts: a wrong move leaves the state (and the key) as it
    was though the observation text changes; a move that changes the world changes it; observation
    (the default) leaves the key to the runner."""
    monkeypatch.setenv("SEEUPO_CACHE", str(tmp_path))
    fam = make_family("textworld", {"test_tasks": 1, "quest_length": 2, "anchor": "state"})
    env = fam.make(fam.tasks("test")[0], seed=0)
    env.reset()
    k0 = env.anchor_state()
    assert isinstance(k0, int)
    env.step("fly to the moon")
    assert env.anchor_state() == k0
    env.step(env.oracle_action())
    assert env.anchor_state() != k0
    plain = make_family("textworld", {"test_tasks": 1, "quest_length": 2})
    e2 = plain.make(plain.tasks("test")[0], seed=0)
    e2.reset()
    assert e2.anchor_state() is None


def test_eval_cli_oracle(tmp_path):
    res = CliRunner().invoke(app, ["eval", "--env", "textworld", "--policy", "oracle", "--k", "1", "--max-tasks", "2",
                                   "--out", str(tmp_path), "env.options.quest_length=2", "model.name=tiny-random"])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "eval.json").read_text())
    assert data["avg@k"] == 1.0 and data["tasks"] == 2


def test_train_runs_on_textworld(tmp_path):
    """`seeupo train --env textworld` end to end (tiny model, small settings)."""
    res = CliRunner().invoke(app, ["train", "--env", "textworld", "--steps", "2", "--out", str(tmp_path),
                                   "model.name=tiny-random", "model.lora=false", "warmup.episodes=4",
                                   "rollout.tasks_per_iteration=2", "rollout.group_size=2", "rollout.max_turns=3",
                                   "eval.tasks=2", "eval.k=1", "run.loggers=[jsonl]",
                                   "env.options.quest_length=2"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["env"] == "textworld" and summary["iterations"] == 2
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum("reward_mean" in r for r in records) == 2


def test_the_textworld_preset_runs_with_a_tiny_model(tmp_path):
    """`--preset textworld` as shipped (brief game text, full history, TextWorld's expert in half the
    warm-up) with only the model and the sizes shrunk; the preset's own run is measured in docs/train.md."""
    res = CliRunner().invoke(app, ["train", "--preset", "textworld", "--steps", "1", "--out", str(tmp_path),
                                   "model.name=tiny-random", "model.lora=false", "warmup.episodes=4",
                                   "rollout.tasks_per_iteration=2", "rollout.group_size=2", "eval.tasks=2", "eval.k=1",
                                   "run.loggers=[jsonl]"])
    assert res.exit_code == 0, res.output
    assert "expert" in res.output  # the oracle warm-up
    cfg = (tmp_path / "config.yaml").read_text()
    assert "observation: brief" in cfg and "source: oracle" in cfg
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["iterations"] == 1
    # held-out games from index 16 (issue 58: 0-15 scored the experiments before), each task's samples kept
    assert list(summary["eval_before"]["per_task"]) == ["textworld-test-16", "textworld-test-17"]
    assert all(len(v) == 1 and set(v) <= {"0", "1"} for v in summary["eval_after"]["per_task"].values())


def test_reward_options_outcome_and_progress(tmp_path, monkeypatch, chat):
    """env.options.reward: outcome gives an episode's total on its last turn; on these generated
    one-quest games the score moves only at the win, so score_delta is the same; progress (TextWorld's
    intermediate reward over the walkthrough's length) rewards each step of the expert's path, 1 in
    all, and a cut-short expert episode its part of the way with score 0. TextWorld's expert (the
    warm-up's oracle source) wins every training game."""
    from seeupo.data.episode import derive_seed
    from seeupo.rollout.runner import RolloutLimits, run_episodes
    from seeupo.rollout.sampler import ScriptedPolicy
    from seeupo.train.warmup import demonstrations

    monkeypatch.setenv("SEEUPO_CACHE", str(tmp_path))
    opts = {"train_tasks": 2, "test_tasks": 1, "quest_length": 3, "rooms": 2, "objects": 2}
    oracle = ScriptedPolicy(lambda env, rng: env.oracle_action(), chat.encode, chat.eos_id)
    runs = {}
    for reward in ("score_delta", "outcome", "progress"):
        fam = make_family("textworld", {**opts, "reward": reward})
        jobs = [(t, i, 0, derive_seed(0, t.id)) for i, t in enumerate(fam.tasks("train"))]
        runs[reward] = [run_episodes(oracle, chat, fam, jobs, RolloutLimits(max_turns=m, max_new_tokens=16))
                        for m in (8, 2)]
    for limit in (0, 1):
        for a, b, c in zip(*(runs[r][limit] for r in runs)):
            assert a.score == b.score == c.score and a.texts == b.texts == c.texts
            assert a.step_rewards == b.step_rewards  # the score moves at the win only
            assert all(r == 0 for r in b.step_rewards[:-1]) and b.step_rewards[-1] == b.score
    for e in runs["progress"][0]:  # the whole walkthrough: a step closer each turn
        assert e.score == 1.0 and e.end_reason == "done" and e.n_turns == 3
        assert e.step_rewards == pytest.approx([1 / 3] * 3)
    for e in runs["progress"][1]:  # two of three commands: two thirds of the way, no score
        assert e.end_reason == "max_turns" and e.score == 0.0 and e.step_rewards == pytest.approx([1 / 3] * 2)
    # the runner's move to the last turn, seen where it changes something: progress rewards, moved
    fam = make_family("textworld", {**opts, "reward": "progress"})
    fam.reward_at_end = True
    jobs = [(t, i, 0, derive_seed(0, t.id)) for i, t in enumerate(fam.tasks("train"))]
    for e in run_episodes(oracle, chat, fam, jobs, RolloutLimits(max_turns=2, max_new_tokens=16)):
        assert e.step_rewards == pytest.approx([0, 2 / 3])
    fam = make_family("textworld", opts)
    eps = demonstrations(chat, fam, RolloutLimits(max_turns=8, max_new_tokens=16), n=4, seed=0, source="oracle")
    assert all(e.score == 1.0 for e in eps)


def test_brief_observations_keep_the_first_line_and_the_list(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEUPO_CACHE", str(tmp_path))
    opts = {"test_tasks": 1, "quest_length": 2}
    full, brief = make_family("textworld", opts), make_family("textworld", {**opts, "observation": "brief"})
    task = full.tasks("test")[0]
    a, b = full.make(task, seed=0), brief.make(task, seed=0)
    fa, fb = a.reset()[0]["content"], b.reset()[0]["content"]
    room = fa.split("\n\n", 2)[2]  # instructions, goal, then the room's text and the list
    assert fb == fa.split(room)[0] + room.strip().splitlines()[0] + "\n" + room.strip().splitlines()[-1]
    assert len(fb) < len(fa) and "Commands you can use:" in fb
    done = False
    while not done:  # the same game: the oracle wins it, each answer one line and the list
        cmd = a.oracle_action()
        ra, rb = a.step(cmd), b.step(cmd)
        assert (ra.reward, ra.done) == (rb.reward, rb.done)
        if not rb.done:
            text = rb.observation[0]["content"]
            assert len(text.splitlines()) == 2 and text.splitlines()[0] == ra.observation[0]["content"].splitlines()[0]
        done = rb.done
    assert b.score() == 1.0
    a.close()
    with pytest.raises(ValueError, match="needs admissible"):
        make_family("textworld", {"observation": "brief", "admissible": False})


def test_an_empty_command_reply_lists_the_commands(tmp_path, monkeypatch):
    """The reply to an empty command names the admissible commands like any other reply, so GiGPO's
    anchor of the next turn tells rooms and inventories apart (issue 59: every empty reply of a group
    was one anchor state)."""
    monkeypatch.setenv("SEEUPO_CACHE", str(tmp_path))
    fam = make_family("textworld", {"test_tasks": 1, "quest_length": 2})
    env = fam.make(fam.tasks("test")[0], seed=0)
    env.reset()
    res = env.step("")
    text = res.observation[0]["content"]
    assert text.startswith("Write one command") and "Commands you can use:" in text
    assert env._listing().strip() in text
    env.close()
