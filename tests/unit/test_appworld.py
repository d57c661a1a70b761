"""AppWorld without its environment and data stops at start with the steps to install them."""

import sys

import pytest
from typer.testing import CliRunner

from seeupo.cli import app
from seeupo.envs.appworld import extract_code, python_has_appworld
from seeupo.envs.base import EnvUnavailable, make_family


def test_unconfigured_appworld_says_how_to_install(monkeypatch):
    monkeypatch.delenv("APPWORLD_PYTHON", raising=False)
    with pytest.raises(EnvUnavailable, match="appworld download data"):
        make_family("appworld")
    res = CliRunner().invoke(app, ["eval", "--env", "appworld", "--k", "1", "model.name=tiny-random"])
    assert res.exit_code == 2 and "pip install appworld" in res.output


@pytest.mark.skipif(python_has_appworld(), reason="this python has appworld")
def test_a_python_without_appworld_is_reported_by_the_worker():
    with pytest.raises(EnvUnavailable, match="cannot import appworld"):
        make_family("appworld", {"python": sys.executable})
    with pytest.raises(EnvUnavailable, match="does not exist"):
        make_family("appworld", {"python": "/no/such/python"})


def test_extract_code():
    assert extract_code("x\n```python\nprint(1)\n```\nmore") == "print(1)"
    assert extract_code("print(2)") == "print(2)"
