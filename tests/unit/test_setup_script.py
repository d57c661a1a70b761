"""setup.sh stops at the first failed install and says which (issue 61: its pip wrapper used to end
in `|| true`, so a failed install let the set-up report success); .ci/run runs the README's test
command."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_failed_install_stops_setup_with_the_step_named(tmp_path):
    env = {**os.environ, "PIP_CONSTRAINT": str(tmp_path / "missing.txt")}  # every pip call fails at once
    p = subprocess.run(["bash", str(ROOT / "setup.sh")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "setup.sh: failed" in p.stderr and "pip install torch==2.13.0" in p.stderr
    assert "| torch" not in p.stdout  # the closing check never ran


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    command = readme.split("```bash\n")[2].split("\n```")[0]
    assert command in (ROOT / ".ci" / "run").read_text()
    assert "ruff check" in command
