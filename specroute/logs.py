"""How a specroute process logs: one line a record, its time first (UTC, ISO 8601 to the
millisecond), then the level and the logger, so lines from the router, its servers and a
benchmark can be put side by side."""

from __future__ import annotations

import logging
import time

FORMAT = "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"


def configure(level: int = logging.WARNING) -> None:
    """Log to standard error in ``FORMAT``, unless the program that runs this one (a test
    runner, an embedding service) has set logging up already."""
    root = logging.getLogger()
    if root.handlers:
        return
    formatter = logging.Formatter(FORMAT, DATE_FORMAT)
    formatter.converter = time.gmtime
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(level)
