import json

from typer.testing import CliRunner

from seeupo.cli import app


def test_eval_oracle_is_perfect_and_writes_json(tmp_path):
    res = CliRunner().invoke(app, ["eval", "--preset", "tiny", "--env", "lookup", "--policy", "oracle", "--k", "1",
                                   "--max-tasks", "10", "--out", str(tmp_path), "env.options={}",
                                   "rollout.max_turns=4"])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "eval.json").read_text())
    assert data["avg@k"] == 1.0 and data["pass@k"] == 1.0 and data["k"] == 1 and data["tasks"] == 10


def test_eval_checkpoint_of_a_tiny_run(tmp_path):
    run = tmp_path / "run"
    small = ["warmup.episodes=8", "eval.tasks=2", "eval.k=1", "rollout.tasks_per_iteration=2",
             "rollout.group_size=2", "run.loggers=[jsonl]"]
    assert CliRunner().invoke(app, ["train", "--preset", "tiny", "--out", str(run), "--steps", "1", *small]).exit_code == 0
    res = CliRunner().invoke(app, ["eval", "--checkpoint", str(run), "--k", "2", "--max-tasks", "3",
                                   "--out", str(tmp_path / "ev")])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert data["tasks"] == 3 and data["k"] == 2 and 0.0 <= data["avg@k"] <= 1.0
    res = CliRunner().invoke(app, ["sample", str(run), "--n", "4", "--top", "2"])
    assert res.exit_code == 0, res.output
    assert "4 episodes" in res.output and "most frequent responses" in res.output
