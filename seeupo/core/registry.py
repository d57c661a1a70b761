"""Pick a function (or declaration) by name from a plain dict, failing with the valid names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


def pick(table: Mapping[str, T], name: str, family: str) -> T:
    """Return ``table[name]``; an unknown name raises ``ValueError`` listing the valid ones.

    >>> pick({"a": 1}, "a", "thing")
    1
    """
    try:
        return table[name]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(table))
        raise ValueError(f"unknown {family} {name!r}; valid names: {valid}") from None
