"""The soak benchmark, short: the router holds no more than it did before the requests, and
its memory stays put once warmed up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specroute.bench.soak import SESSION_PER_BACKEND
from specroute.cli import main
from specroute.router.upstream.pool import KEEPALIVE

CONCURRENCY = 16
IDLE = KEEPALIVE + 1  # the pool's sweep has closed every connection the requests left idle


def test_a_short_soak_leaves_the_router_as_it_found_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "soak.json"
    argv = [
        "bench",
        "soak",
        "--requests",
        "2000",
        "--concurrency",
        str(CONCURRENCY),
        "--every",
        "500",
        "--idle",
        str(IDLE),
        "--out",
        str(out),
    ]
    assert main(argv) == 0, capsys.readouterr().out
    said = capsys.readouterr()
    assert said.err.count("soak: ") == 6  # the start, every 500, after idle
    document = json.loads(out.read_text())
    assert document["ok"], document["checks"]
    tally, router = document["tally"], document["router"]
    assert tally["count"] == 2000 and tally["verdicts"].get("lost", 0) == 0
    assert router["inflight"] == 0 and document["end"]["inflight"] == 0
    start, end = document["start"]["router"], document["end"]["router"]
    assert [s["requests"] for s in document["samples"]] == [500, 1000, 1500, 2000]
    # after the client left and the pool's keep-alive passed, only the connections of health
    # checks, polls and aborts may remain (aiohttp's session): none of the requests'
    assert end["clients"] == start["clients"] and end["threads"] == start["threads"]
    assert end["fds"] - end["upstream"] == start["fds"] - start["upstream"]
    assert max(s["router"]["upstream"] for s in document["samples"]) > 4  # the pool was used
    assert end["upstream"] <= SESSION_PER_BACKEND * 2
    assert document["end"]["tasks"] <= document["start"]["tasks"]  # no task left behind
    assert max(s["tasks"] for s in document["samples"]) > document["start"]["tasks"]  # counted
    # memory: the first requests warm the router up, then it stays
    assert end["rss_kb"] - start["rss_kb"] < 16 * 1024
    assert end["rss_kb"] - document["samples"][0]["router"]["rss_kb"] < 4 * 1024
