"""The emulator's accept length on a schedule of emulated time, live and in virtual time."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from specroute.emulator.accept_schedule import AcceptChange, parse_schedule
from specroute.emulator.acceptance import AcceptanceError
from specroute.emulator.virtual import VirtualServer, VirtualTime
from tests.emulators import emulator_config, running_emulator


def test_a_schedule_reads_as_changes_in_order() -> None:
    assert parse_schedule("0:3.0, 30:1.6", 3) == (AcceptChange(0, 3.0), AcceptChange(30, 1.6))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0:3.0,x", "'x' is not SECONDS:ACCEPT_LENGTH"),
        ("30:1.6,10:3.0", "ascending"),
        ("-1:2", "ascending"),
        ("0:9", "outside [1, 4]"),
        ("5", "is not SECONDS:ACCEPT_LENGTH"),
    ],
)
def test_a_bad_schedule_is_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(AcceptanceError, match=message.replace("[", r"\[")):
        parse_schedule(text, 3)


async def accept_length(url: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/emulator/acceptance") as r:
        return float((await r.json())["accept_length"])


async def test_a_live_emulator_changes_its_accept_length_on_schedule() -> None:
    flags = ("--mode", "spec", "--time-scale", "0.05", "--accept-schedule", "0:3.0,6:1.6")
    async with running_emulator(*flags) as url:
        await asyncio.sleep(0.05)  # 1 emulated second
        assert await accept_length(url) == pytest.approx(3.0, abs=1e-3)
        await asyncio.sleep(0.35)  # past 6 emulated seconds (0.3 s of wall time)
        assert await accept_length(url) == pytest.approx(1.6, abs=1e-3)


def test_virtual_time_follows_the_schedule() -> None:
    config = emulator_config("--mode", "spec", "--accept-schedule", "0:3.0,30:1.6")
    server = VirtualServer("spec", config)
    time: VirtualTime[VirtualServer] = VirtualTime(lambda server, step: None)
    time.follow_schedule(server)
    time.run(until=29.0)
    assert server.engine.acceptance.describe()["accept_length"] == pytest.approx(3.0, abs=1e-3)
    time.run(until=31.0)
    assert server.engine.acceptance.describe()["accept_length"] == pytest.approx(1.6, abs=1e-3)
