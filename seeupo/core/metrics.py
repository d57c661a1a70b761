"""Evaluation metrics over a ``[tasks, k]`` success matrix (1 = success)."""

from __future__ import annotations

import torch


def avg_at_k(success_TK: torch.Tensor) -> float:
    """Mean success over all ``k`` samples of all tasks.

    >>> avg_at_k(torch.tensor([[1., 0.], [0., 0.]]))
    0.25
    """
    return float(success_TK.float().mean()) if success_TK.numel() else 0.0


def pass_at_k(success_TK: torch.Tensor) -> float:
    """Share of tasks with at least one success among their ``k`` samples.

    >>> pass_at_k(torch.tensor([[1., 0.], [0., 0.]]))
    0.5
    """
    return float((success_TK > 0).any(-1).float().mean()) if success_TK.numel() else 0.0
