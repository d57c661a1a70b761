"""Shared by the benchmark scripts."""

import json
import sys
from pathlib import Path


def finish(out: dict, script: str, argv, json_path) -> dict:
    """Record the command that produced ``out`` and write it to ``json_path`` (if given)."""
    out["command"] = " ".join(["python", f"benchmarks/{script}", *(argv if argv is not None else sys.argv[1:])])
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(out, indent=1))
    return out
