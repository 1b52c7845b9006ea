"""The flags of ``specroute serve`` made from the router's settings model: every setting
that no flag declared by hand in ``serve_command`` takes, as ``--NAME`` (its name with
dashes), of its type, with its description as help. The table below is written by
``python -m docsgen.settings_flags`` from ``RouterSettings`` (importing the model on every
command's start would cost about a second) and checked against it by
``tests/core/test_settings_flags.py``: a new setting needs no declaration of its own, only
that command run again."""

from __future__ import annotations

import argparse
from typing import Any

# written by `python -m docsgen.settings_flags`: do not edit
FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--max-backends", "int", "most backends known at once (default 64)"),
    (
        "--stale-after",
        "float",
        "seconds after which a backend's last reading is not believed (default 2.0)",
    ),
    ("--health-interval", "float", "seconds between health checks (default 2.0)"),
    (
        "--health-timeout",
        "float",
        "seconds a health check may take before it counts as failed (default 2.0)",
    ),
    (
        "--eject-after-failures",
        "int",
        "a backend's failures in a row (requests or health checks) that eject it (default 3)",
    ),
    (
        "--eject-seconds",
        "float",
        "an ejection's first cool-down; each ejection in a row adds as much (default 5.0)",
    ),
    ("--eject-max-seconds", "float", "the longest cool-down of an ejection (default 30.0)"),
    (
        "--readmit-after-successes",
        "int",
        "after the cool-down, successful trials in a row that readmit a backend (default 1)",
    ),
    ("--connect-timeout", "float", "seconds to open a connection to a backend (default 5.0)"),
    ("--idle-timeout", "float", "longest silence within a stream (default 300.0)"),
    (
        "--request-timeout",
        "float",
        "deadline of a whole non-streamed answer, sent at its end (default 1800.0)",
    ),
    ("--max-body-bytes", "int", "largest request body accepted (413 past it) (default 8388608)"),
    (
        "--body-timeout",
        "float",
        "longest time a client may take to send a whole request body (default 60.0)",
    ),
    (
        "--client-idle-timeout",
        "float",
        "a client connection that has not sent a whole request head this long after it opened or after its last answer is closed: idle keep-alive and slowloris alike (longer than a load balancer's usual 60 s, so the balancer closes first) (default 75.0)",
    ),
    (
        "--max-header-bytes",
        "int",
        "longest target in a request line, longest header name or value (default 8190)",
    ),
    ("--max-headers", "int", "most headers in one request (default 128)"),
    (
        "--max-pipelined-requests",
        "int",
        "requests a client may send on one connection ahead of the answer it waits for: past them the connection is not read until answers catch up (default 32)",
    ),
    (
        "--max-pipelined-bytes",
        "int",
        "bytes of requests a client may send on one connection ahead of the answer it waits for: past them the connection is not read until answers catch up (default 1048576)",
    ),
    (
        "--client-write-timeout",
        "float",
        "a client that reads nothing of its answer this long is cut off, and its request at the backend aborted (default 60.0)",
    ),
    (
        "--max-upstream-head-bytes",
        "int",
        "longest head of a backend's answer (its status line and headers); a longer one is a broken answer (default 65536)",
    ),
    (
        "--recent-decisions",
        "int",
        "how many of the last decisions /router/status shows (default 50)",
    ),
)


def add_settings_flags(group: argparse._ArgumentGroup) -> None:
    kinds: dict[str, Any] = {"int": int, "float": float}
    for flag, kind, about in FLAGS:
        metavar = "S" if flag.endswith(("-timeout", "-seconds", "-interval", "-after")) else "N"
        group.add_argument(flag, type=kinds[kind], metavar=metavar, help=about)
