"""``sgl_kernel.speculative``, where SGLang looks for NGRAM's tree reconstruction."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from . import missing
from .tree import reconstruct_indices_from_tree_mask

__all__ = ["reconstruct_indices_from_tree_mask"]


def __getattr__(name: str) -> Callable[..., NoReturn]:
    if name.startswith("__"):
        raise AttributeError(name)
    return missing(f"speculative.{name}")
