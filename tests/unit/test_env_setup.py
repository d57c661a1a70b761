"""An environment whose package is missing fails at start with the command that installs it."""

import sys

import pytest
from typer.testing import CliRunner

from seeupo.cli import app
from seeupo.envs.base import EnvUnavailable, make_family


@pytest.fixture
def no_bfcl(monkeypatch):
    for name in [m for m in sys.modules if m == "bfcl_eval" or m.startswith("bfcl_eval.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)  # import bfcl_eval -> ImportError


def test_missing_bfcl_names_the_setup_command(no_bfcl):
    with pytest.raises(EnvUnavailable, match="seeupo setup bfcl"):
        make_family("bfcl")
    res = CliRunner().invoke(app, ["eval", "--env", "bfcl", "--policy", "oracle", "--k", "1", "--max-tasks", "1",
                                   "model.name=tiny-random"])
    assert res.exit_code == 2 and "seeupo setup bfcl" in res.output


def test_unknown_setup_name_is_an_error():
    res = CliRunner().invoke(app, ["setup", "nothing"])
    assert res.exit_code == 2 and "available: bfcl" in res.output
