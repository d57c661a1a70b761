"""The one place metrics are written: ``metrics.jsonl``, tensorboard, wandb (when asked), and the
training-curve plot at the end."""

from __future__ import annotations

import json
import math
from pathlib import Path


def strict(obj):
    """``obj`` with every non-finite float replaced by None, so ``json.dumps(..., allow_nan=False)``
    writes strict JSON (NaN and Infinity are not JSON; a reader such as ``jq`` rejects them)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return obj


def dumps(obj, **kw) -> str:
    """Strict JSON text of ``obj`` (non-finite floats as null)."""
    return json.dumps(strict(obj), allow_nan=False, **kw)


class RunLog:
    def __init__(self, folder: Path, loggers: list[str], *, resume_from: int | None = None,
                 resume_lines: int | None = None, config: dict | None = None):
        """A new log (``resume_from`` None), or the log of a resumed run: its first ``resume_lines``
        lines (what the checkpoint had logged when it was written) or, for checkpoints that do not
        record that, the lines covering iterations before ``resume_from``. Later lines are dropped:
        the resumed run writes them again, so the file equals an uninterrupted run's."""
        self.path = folder / "metrics.jsonl"
        if resume_from is not None and self.path.exists():
            lines = [line for line in self.path.read_text().splitlines() if line.strip()]
            if resume_lines is not None:
                keep = lines[:resume_lines]
            else:
                keep = [line for line in lines if _covered(json.loads(line), resume_from)]
            self.path.write_text("".join(k + "\n" for k in keep))
        else:
            self.path.write_text("")
        self.lines = len(self.path.read_text().splitlines())
        self.tb = None
        if "tensorboard" in loggers:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(folder / "tensorboard"))
            except ImportError as e:
                raise RuntimeError("run.loggers has 'tensorboard' but the package is missing: "
                                   "pip install tensorboard (or drop it from run.loggers)") from e
        self.wandb = None
        if "wandb" in loggers:
            try:
                import wandb
            except ImportError as e:
                raise RuntimeError("run.loggers has 'wandb' but the package is missing: pip install wandb") from e
            self.wandb = wandb.init(project="seeupo", dir=str(folder), config=config,
                                    mode=None if wandb.api.api_key else "offline")

    def log(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(dumps(record) + "\n")
            f.flush()
        self.lines += 1
        step = record.get("iteration", 0)
        scalars = {k: v for k, v in _flatten(record) if isinstance(v, (int, float)) and math.isfinite(v)}
        if self.tb:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb:
            self.wandb.log(scalars, step=step)

    def close(self) -> None:
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()


class NullLog:
    """What processes other than the main one log to: nothing."""

    lines = 0

    def log(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


def code_version() -> dict:
    """Which training code ran: the package version, ``digest`` (a hash of the package's .py and .yaml
    files, paths and contents) and, in a git checkout, its commit and whether the package's files
    differed from it (``dirty``); records of one experiment name it so that trials of different code
    are not mixed unseen (``seeupo.sweep.records.code_versions``)."""
    import hashlib
    import subprocess

    import seeupo

    pkg = Path(seeupo.__file__).resolve().parent
    root = pkg.parent
    digest = hashlib.sha256()  # the package's own files: the same digest is the same code, checkout or copy
    for f in sorted(p for p in pkg.rglob("*") if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts):
        digest.update(f.relative_to(pkg).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    out = {"version": seeupo.__version__, "digest": digest.hexdigest()[:16], "commit": None, "dirty": None}
    try:
        def git(*a):
            return subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True, timeout=10)
        head = git("rev-parse", "HEAD")
        if head.returncode == 0:
            out["commit"] = head.stdout.strip()
            out["dirty"] = bool(git("status", "--porcelain", "--", "seeupo").stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def platform_info() -> dict:
    """Where a run computes: results of the same config and seed agree to the bit only on the same CPU
    kernels (torch's capability: AVX2, AVX512, ...) and package versions, so summaries carry them."""
    import importlib.metadata as md
    import platform

    import torch

    def version(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "gpu": cuda,
            "threads": torch.get_num_threads(), "python": platform.python_version(),
            **{pkg: version(pkg) for pkg in ("torch", "transformers", "peft")}}


def _covered(record: dict, checkpoint_iteration: int) -> bool:
    """Whether a metrics line describes training the checkpoint already contains: iterations before it,
    and evaluations of parameters at or before it."""
    it = record.get("iteration", -1)
    return it < checkpoint_iteration or ("eval" in record and "reward_mean" not in record and not record.get("final")
                                         and it <= checkpoint_iteration)


def _flatten(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flatten(v, f"{prefix}{k}/")
        else:
            yield f"{prefix}{k}", v


def _num(v) -> float:
    """A metric for plotting: null (a non-finite value in strict JSON) becomes NaN, a gap in the line."""
    return float("nan") if v is None else v


def read_metrics(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def plot_curves(folder: Path, records: list[dict], title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if "reward_mean" in r]
    evals = [r for r in records if "eval" in r]
    panels = [("reward_mean", "reward (train)"), ("success_rate", "success (train)"), ("entropy", "entropy"),
              ("clipfrac", "clip fraction"), ("episode/turns", "turns per episode"),
              ("tool/error_rate", "tool-call error rate")]
    fig, axes = plt.subplots(2, 4, figsize=(16, 6.5))
    axes = axes.ravel()
    for ax, (key, label) in zip(axes, panels):
        xs = [r["iteration"] for r in train if key in r]
        ax.plot(xs, [_num(r[key]) for r in train if key in r], marker=".")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    ax = axes[6]
    for key in ("avg@k", "pass@k"):
        ax.plot([r["iteration"] for r in evals], [_num(r["eval"][key]) for r in evals], marker="o", label=key)
    ax.set_title("held-out eval", fontsize=10)
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    ax.grid(alpha=0.3)
    ax = axes[7]
    turns = sorted({t for r in train for t in r.get("turn", {})}, key=int)
    for t in turns:
        xs = [r["iteration"] for r in train if t in r.get("turn", {})]
        ax.plot(xs, [_num(r["turn"][t].get("adv_x_factor_mean", 0.0)) for r in train if t in r.get("turn", {})],
                label=f"turn {t}")
    ax.set_title("mean advantage x factor per turn", fontsize=10)
    if turns:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    for ax in axes:
        ax.set_xlabel("iteration", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = folder / "curves.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
