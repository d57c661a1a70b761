"""The logic the command line dispatches to (issue 61: cli.py only parses): the sweep's progress lines,
config resolution's refusals, and which errors the command line prints as one line."""

from types import SimpleNamespace

import pytest

from seeupo.errors import UsageError, usage_errors
from seeupo.sweep import command
from seeupo.train import launch


def test_the_sweep_pacer_counts_finished_grid_trials_only(monkeypatch):
    monkeypatch.setattr(command, "finished_trials", lambda spec: 3)  # restored before this run
    lines = []
    spec = SimpleNamespace(exp=SimpleNamespace(metric="avg@k"), workers=2, records=None)
    pacer = command.Pacer(spec, total=10, say=lines.append, warn=lines.append)
    pacer("a", 0, 0.5, 100.0)
    pacer("a", 1, command.INTERRUPTED, 5000.0)  # stopped from outside: neither done nor in the pace
    pacer("b", 0, None, 7000.0)  # failed: likewise
    pacer("tune:b", "abc", 0.25, 9000.0)  # a tuning trial: no grid pace
    # 4 of 10 done; 6 left at the median finished trial (100 s), 2 at a time: 300 s
    assert lines[0] == "[progress] trial a/seed-0: avg@k 0.500 (100 s); 4/10 done; about 5 min left at 100 s a trial, 2 at a time; 1 this run"
    assert lines[1].startswith("[progress] trial a/seed-1: [stopped from outside: queued again] (5000 s); 4/10 done; about 5 min")
    assert lines[2].startswith("[progress] trial b/seed-0: [failed: see its train.log] (7000 s); 4/10 done; about 5 min")
    assert lines[3] == "[progress] trial tune:b/seed-abc: avg@k 0.250 (9000 s); 4 this run"


def test_the_pacer_packs_records_when_due(monkeypatch, tmp_path):
    monkeypatch.setattr(command, "finished_trials", lambda spec: 0)
    packed = []
    monkeypatch.setattr(command.recs, "save", lambda spec, records: packed.append(records) or records / "part")
    spec = SimpleNamespace(exp=SimpleNamespace(metric="avg@k"), workers=1, records=tmp_path)
    pacer = command.Pacer(spec, total=2, say=lambda m: None, warn=lambda m: None, every=3600)
    pacer("a", 0, 0.5, 1.0)
    assert packed == []
    pacer.saved -= 3601  # an hour later
    pacer("a", 1, 0.5, 1.0)
    assert packed == [tmp_path]


def test_config_resolution_refuses_with_the_fix(tmp_path):
    with pytest.raises(UsageError, match="--resume needs --out"):
        launch.build_config("tiny", resume=True)
    with pytest.raises(UsageError, match="holds no run"):
        launch.build_config("tiny", resume=True, out=str(tmp_path))
    with pytest.raises(UsageError, match="not a run folder"):
        launch.run_config(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(UsageError, match="before its first one"):
        launch.latest_checkpoint(tmp_path)
    cfg = launch.build_config("tiny", ["rollout.group_size=3"], algo="grpo", steps=2, seed=7)
    assert (cfg.algo.name, cfg.run.iterations, cfg.run.seed, cfg.rollout.group_size) == ("grpo", 2, 7, 3)


def test_the_command_line_prints_config_and_input_errors_as_one_line():
    from seeupo.train.config import ConfigError
    from seeupo.train.stack import InputError

    assert set(usage_errors()) == {UsageError, ConfigError, InputError}
    with pytest.raises(ConfigError):
        launch.build_config("tiny", ["rollout.group_size=-1"])
