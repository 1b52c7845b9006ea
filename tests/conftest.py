"""Fixtures that several test files share."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.emulators import FAST, running_emulator


@pytest.fixture
async def backends() -> AsyncIterator[tuple[str, str]]:
    """A speculative and a plain emulator at the ``FAST`` time scale: their URLs."""
    async with (
        running_emulator("--mode", "spec", *FAST) as spec,
        running_emulator("--mode", "base", *FAST) as base,
    ):
        yield spec, base
