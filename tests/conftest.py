"""Fixtures that several test files share."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest

from tests.emulators import FAST, running_emulator


@pytest.fixture(scope="session", autouse=True)
def traces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Where a profile that names no folder is written (SGLang's default, and the
    emulator's, is /tmp): the tests' own, so that none is left in /tmp."""
    os.environ["SGLANG_TORCH_PROFILER_DIR"] = str(tmp_path_factory.mktemp("traces"))
    yield
    del os.environ["SGLANG_TORCH_PROFILER_DIR"]


@pytest.fixture(autouse=True)
def openai_clients_kept(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every ``openai.AsyncOpenAI`` a test makes lives until the test ends: a client left to
    the collector while another client's requests are in flight can hang those requests
    until their timeout (openai 3, seen with 16 requests in flight), and helpers make
    clients that no one holds."""
    kept: list[openai.AsyncOpenAI] = []
    made = openai.AsyncOpenAI.__init__

    def keeping(self: openai.AsyncOpenAI, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        kept.append(self)

    monkeypatch.setattr(openai.AsyncOpenAI, "__init__", keeping)
    yield
    kept.clear()  # collected once the test's requests are all done


@pytest.fixture
async def backends() -> AsyncIterator[tuple[str, str]]:
    """A speculative and a plain emulator at the ``FAST`` time scale: their URLs."""
    async with (
        running_emulator("--mode", "spec", *FAST) as spec,
        running_emulator("--mode", "base", *FAST) as base,
    ):
        yield spec, base


# Rehearsals timed against emulators: each keeps a scaled clock and uses about half a core
# of two or less (measured per test), so `make unit` runs them two at a time (``-m paced``,
# pytest-xdist), after the rest has run side by side. Those that take a core or more, time
# the router's own CPU, or (affinity) ran past their lag limit beside another, run one at a
# time (``-m alone``). Rehearsals in virtual time (bands, coverage, calibration by context)
# keep no clock: they run side by side.
PACED = frozenset(
    {
        "test_aiperf",
        "test_calibrate",
        "test_capacity",
        "test_compare",
        "test_demo",
        "test_head_to_head",
        "test_online_live",
        "test_online_workers",
        "test_scale_out",
        "test_soak",
    }
)
ALONE = frozenset({"test_affinity", "test_context_head_to_head", "test_lag", "test_overhead"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in PACED:
            item.add_marker(pytest.mark.paced)
        elif item.path.stem in ALONE:
            item.add_marker(pytest.mark.alone)
