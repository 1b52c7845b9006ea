"""Pure functions of a prompt's text, remembered by the text's hash.

A regular expression over a long prompt takes about a millisecond, and a replay or a
benchmark sends the same few hundred prompts over and over; hashing the text is some fifty
times cheaper. Only the hash is kept (a few bytes a prompt, the texts are not held), and
after ``SIZE`` different keys the memory starts again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")
SIZE = 4096


def by_text(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn(text, *rest)`` remembered by ``(hash(text), *rest)``; ``rest`` must be hashable."""
    known: dict[tuple[Hashable, ...], T] = {}

    @functools.wraps(fn)
    def remembered(text: str, *rest: Hashable) -> T:
        key = (hash(text), *rest)
        if key not in known:
            if len(known) >= SIZE:
                known.clear()
            known[key] = fn(text, *rest)
        return known[key]

    return remembered
