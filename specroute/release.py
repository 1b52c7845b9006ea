"""The installed release of specroute, as the command line and the router's answers give it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def release() -> str:
    """The installed version; ``unknown`` when run from a checkout never installed."""
    try:
        return version("specroute")
    except PackageNotFoundError:
        return "unknown"
