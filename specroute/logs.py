"""How a specroute process logs: one line a record, its time first (UTC, ISO 8601 to the
millisecond), then the level and the logger, so lines from the router, its servers and a
benchmark can be put side by side; or, in the ``json`` format, one JSON object a line
with the same first fields, and a record's structured ``fields`` (an access line's) and
``request_id`` as fields of their own."""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Literal

FORMAT = "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"
LogFormat = Literal["text", "json"]


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime(DATE_FORMAT, time.gmtime(record.created))
        line: dict[str, Any] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            line.update(fields)
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            line.setdefault("request_id", request_id)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``configure`` installs: the one whose format it may change later."""


def formatter(log_format: LogFormat) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    text = logging.Formatter(FORMAT, DATE_FORMAT)
    text.converter = time.gmtime
    return text


def configure(level: int = logging.WARNING, log_format: LogFormat = "text") -> None:
    """Log to standard error in ``log_format``, unless the program that runs this one (a
    test runner, an embedding service) has set logging up already; called again, the
    format of the handler it installed changes."""
    root = logging.getLogger()
    if root.handlers:
        for handler in root.handlers:
            if isinstance(handler, _Handler):
                handler.setFormatter(formatter(log_format))
        return
    handler = _Handler()
    handler.setFormatter(formatter(log_format))
    root.addHandler(handler)
    root.setLevel(level)
