"""Emulated SGLang servers on loopback ports, started inside the test's event loop."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from specroute.cli import parser
from specroute.emulator.config import EmulatorConfig
from specroute.emulator.server import create_app
from specroute.model_flags import emulator_config as config_from
from tests.apps import serving

FAST = ("--time-scale", "0.05")  # an emulator's time, twenty times faster than modelled


def emulator_config(*flags: str) -> EmulatorConfig:
    """A config built from the same flags a user passes to ``specroute emulate``."""
    args: argparse.Namespace = parser().parse_args(["emulate", *flags])
    return config_from(args)


@asynccontextmanager
async def running_emulator(*flags: str) -> AsyncIterator[str]:
    """Serve an emulator on a free loopback port; yields its base URL."""
    async with serving(create_app(emulator_config(*flags))) as url:
        yield url
