"""BFCL v4 multi-turn on the real package: the decoder, per-episode isolation, malformed calls, the
oracle and empty policies against BFCL's own checker, and the eval command."""

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("bfcl_eval", reason="needs bfcl-eval: run `seeupo setup bfcl`")

from seeupo.cli import app  # noqa: E402
from seeupo.envs.base import make_family  # noqa: E402
from seeupo.envs.bfcl import Malformed, backend_signatures, check_call, decode_calls  # noqa: E402
from seeupo.train.config import load_config  # noqa: E402


@pytest.fixture(scope="module")
def base():
    return make_family("bfcl", {"category": "multi_turn_base"})


def play(fam, task, script, seed=0, limit=100):
    env = fam.make(task, seed=seed)
    env.reset()
    infos = []
    for _ in range(limit):
        res = env.step(script(env))
        infos.append(res.info)
        if res.done:
            break
    return env.score(), infos


def test_decoder():
    assert decode_calls("The file is moved.") == []
    assert decode_calls("") == [] and decode_calls("Done") == []
    calls = decode_calls("[cd(folder='document'), sort('a.txt'), ls(a=True)]")
    assert [(c.name, c.args, c.kwargs) for c in calls] == [
        ("cd", [], {"folder": "document"}), ("sort", ["a.txt"], {}), ("ls", [], {"a": True})]
    assert len(decode_calls("```python\n[pwd()]\n```")) == 1
    assert len(decode_calls("pwd()")) == 1  # BFCL wraps a bare call in a list too
    for bad in ("[cd(folder=]", "[cd(folder=x)]", "[cd(folder=open('f'))]", "[cd(**{'folder': 'a'})]",
                "[cd(folder='a'), 3]", "[os.system('ls')]"):
        with pytest.raises(Malformed):
            decode_calls(bad)


def test_check_call_rejects_unknown_functions_arguments_and_types(base):
    task = base.tasks("train")[0]
    sigs = backend_signatures(task.data["entry"]["involved_classes"])
    docs = {d["name"]: d for d in task.data["docs"]}
    assert check_call(decode_calls("[sort('a.txt')]")[0], docs, sigs) == "sort(file_name='a.txt')"
    for bad in ("[open(file='x', mode='w')]", "[__import__(name='os')]", "[cd(where='a')]", "[cd()]",
                "[mkdir(dir_name=5)]", "[cd(folder=['a'])]", "[ls(a='yes')]"):
        with pytest.raises(Malformed):
            check_call(decode_calls(bad)[0], docs, sigs)


def test_malformed_calls_become_counted_error_observations(base):
    task = base.tasks("train")[0]
    env = base.make(task, seed=0)
    env.reset()
    for bad in ("[cd(folder=]", "[no_such_function()]", "[mkdir(dir_name=5)]", "[cd(folder=open('x'))]"):
        res = env.step(bad)
        assert not res.done and res.info["tool_error"] == 1 and res.observation[0]["role"] == "tool"
        assert res.observation[0]["content"].startswith("Error:")
    res = env.step("[cd(folder='no_such_dir')]")  # a valid call the backend answers with an error
    assert not res.done and res.info["tool_error"] == 0 and "error" in res.observation[0]["content"].lower()
    assert env.counts["malformed"] == 4 and env.counts["calls"] == 1
    assert env.score() == 0.0


def test_interleaved_episodes_of_one_task_keep_separate_backend_state(base):
    task = base.tasks("train")[0]  # GorillaFileSystem, starts in /workspace with document/ and archive/
    a, b = base.make(task, seed=1), base.make(task, seed=1)  # same seed on purpose: state must still differ
    a.reset(), b.reset()
    assert a.step("[mkdir(dir_name='only_in_a')]").info["tool_error"] == 0
    b_ls = b.step("[ls()]").observation[0]["content"]
    a_ls = a.step("[ls()]").observation[0]["content"]
    assert "only_in_a" in a_ls and "only_in_a" not in b_ls
    b.step("[cd(folder='document')]")
    assert "only_in_a" in a.step("[ls()]").observation[0]["content"]  # a's cwd did not move with b's
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    a.score(), b.score()
    assert not [k for k in vars(multi_turn_utils) if k.startswith((a.key + "_", b.key + "_"))]


@pytest.mark.parametrize("category", ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param",
                                      "multi_turn_long_context"])
def test_oracle_scores_one_and_empty_scores_zero_on_every_entry(category):
    fam = make_family("bfcl", {"category": category})
    for split in ("train", "test"):
        tasks = fam.tasks(split)
        assert len(tasks) == 100
        oracle = [play(fam, t, lambda env: env.oracle_action())[0] for t in tasks]
        empty = [play(fam, t, lambda env: "")[0] for t in tasks]
        assert sum(oracle) == 100 and sum(empty) == 0, (category, split)


def test_a_wrong_answer_fails_the_checker(base):
    """The oracle with its first question's calls left out: BFCL's checker must reject it."""
    def skip_first(env):
        return "Done." if env.q == 0 else env.oracle_action()
    tasks = [t for t in base.tasks("test") if t.data["ground_truth"][0]]
    assert sum(play(base, t, skip_first)[0] for t in tasks) == 0


def test_step_limit_fails_the_entry_like_bfcl(base):
    score, infos = play(base, base.tasks("train")[0], lambda env: "[pwd()]")
    assert score == 0.0 and infos[-1].get("force_quit") == 1 and len(infos) == 21


def test_switching_env_applies_its_overlay_and_drops_the_old_options():
    cfg = load_config("default", ["env.name=bfcl"])
    assert cfg.env.options == {"category": "multi_turn_base", "doc_format": "compact"}
    assert cfg.rollout.max_context == 8192 and cfg.rollout.max_turns == 20
    assert [t.id for t in make_family("bfcl").tasks("test")][:2] == ["multi_turn_base_100", "multi_turn_base_101"]
    same = load_config("default", ["env.name=lookup"])
    assert same.env.options == load_config("default").env.options


def test_eval_cli_oracle_and_context_limit(tmp_path):
    res = CliRunner().invoke(app, ["eval", "--env", "bfcl", "--split", "test", "--policy", "oracle", "--k", "1",
                                   "--max-tasks", "6", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "eval.json").read_text())
    assert (data["avg@k"], data["pass@k"], data["k"], data["tasks"]) == (1.0, 1.0, 1, 6)
    assert data["by_category"]["multi_turn_base"]["tasks"] == 6
    # prompts longer than the context end the episode by "context" (scored 0), never crash the run
    res = CliRunner().invoke(app, ["eval", "--env", "bfcl", "--policy", "oracle", "--k", "1", "--max-tasks", "3",
                                   "--out", str(tmp_path / "short"), "rollout.max_context=600"])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "short" / "eval.json").read_text())
    assert data["avg@k"] == 0.0 and data["episodes"]["episode/end_context"] == 1.0


def test_train_runs_on_bfcl(tmp_path):
    """`seeupo train --env bfcl` end to end: one SeeUPO iteration (tiny model, small settings)."""
    res = CliRunner().invoke(app, ["train", "--env", "bfcl", "--steps", "1", "--out", str(tmp_path),
                                   "model.name=tiny-random", "model.lora=false", "warmup.enabled=on",
                                   "warmup.episodes=2", "rollout.tasks_per_iteration=2", "rollout.group_size=2",
                                   "rollout.max_turns=3", "rollout.max_new_tokens=16", "eval.tasks=1",
                                   "eval.k=1", "run.loggers=[jsonl]"])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "reward_mean" in r]
    assert len(train) == 1 and train[0]["optimizer_steps"] >= 1
    assert json.loads((tmp_path / "summary.json").read_text())["algorithm"] == "seeupo"


def test_the_gpu_preset_runs_end_to_end_on_a_cpu_with_a_random_model_of_its_architecture(tmp_path):
    """--preset bfcl_gpu (Qwen3 + LoRA, vLLM, the oracle warm-up, the paper's KL) with only what a CPU
    needs changed: a random Qwen3 of 2 layers, the HF sampler, float32, sizes shrunk; one iteration."""
    res = CliRunner().invoke(app, ["train", "--preset", "bfcl_gpu", "--steps", "1", "--out", str(tmp_path),
                                   "model.name=tiny-random-qwen3", "rollout.backend=hf", "run.device=cpu",
                                   "model.dtype=float32", "warmup.episodes=4", "warmup.batch_episodes=2",
                                   "rollout.tasks_per_iteration=2", "rollout.group_size=2", "rollout.max_turns=3",
                                   "rollout.max_new_tokens=16", "optim.micro_batch_tokens=4096", "eval.tasks=1",
                                   "eval.k=1", "run.loggers=[jsonl]"])
    assert res.exit_code == 0, res.output
    cfg = load_config(str(tmp_path / "config.yaml"))
    assert cfg.model.lora and cfg.warmup.source == "oracle" and cfg.algo.kl_coef == 0.002
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["iterations"] == 1 and summary["warmup"]
    train = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in train if "reward_mean" in r] == [0]
