"""``seeupo setup NAME``: install an optional environment's package into this Python environment."""

from __future__ import annotations

import importlib
import importlib.metadata as md
import subprocess
import sys

SETUPS = {
    # name: (pip arguments, import check, why it is not a plain extra)
    "bfcl": (["--no-deps", "bfcl-eval=={bfcl}", "mpmath"], "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker",
             "bfcl-eval's declared dependencies pin numpy 1.26 and pull ~1.9 GB of API clients; "
             "its backends need only mpmath"),
    "textworld": (["textworld=={textworld}"], "textworld.generator",
                  "the same as `pip install 'seeupo[textworld]'`, offered for symmetry"),
}


def install(name: str, say) -> int:
    """Install ``name`` (one of ``SETUPS``) unless its pinned versions are already there and import;
    returns pip's exit status (0 when nothing was needed)."""
    from seeupo.envs.bfcl import BFCL_VERSION
    from seeupo.envs.textworld import TEXTWORLD_VERSION

    args, module, why = SETUPS[name]
    args = [a.format(bfcl=BFCL_VERSION, textworld=TEXTWORLD_VERSION) for a in args]
    pins = {a.split("==")[0]: a.split("==")[1] for a in args if "==" in a}
    try:
        if all(md.version(p) == v for p, v in pins.items()):
            importlib.import_module(module)
            say(f"{name}: already installed ({', '.join(f'{p} {v}' for p, v in pins.items())})")
            return 0
    except (md.PackageNotFoundError, ImportError):
        pass
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args]
    say(f"{name}: {' '.join(cmd[2:])}  ({why})")
    rc = subprocess.call(cmd)
    if rc != 0:
        say(f"{name}: pip failed (exit {rc})")
        return rc
    importlib.invalidate_caches()
    importlib.import_module(module)
    say(f"{name}: installed")
    return 0
