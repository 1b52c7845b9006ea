"""``specroute bench calls``: a request's Python calls in the router, this code against
another version's, each counted under cProfile with N and 2N requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from specroute.bench.call_count import CallPlan, count_calls, render

# another "version": no router, an answer of its own to every request (few calls a request)
_ANSWERS_ITSELF = """
import sys
from aiohttp import web

async def ready(request: web.Request) -> web.Response:
    return web.json_response({"version": "stand-in"})

async def chat(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"choices": [{"message": {"content": "done"}}]})

app = web.Application()
app.router.add_get("/ready", ready)
app.router.add_post("/v1/chat/completions", chat)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[sys.argv.index("--port") + 1]))
"""


def test_a_folder_without_specroute_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pip install --target"):
        CallPlan(str(tmp_path))
    (tmp_path / "specroute").mkdir()
    with pytest.raises(ValueError, match="modes among"):
        CallPlan(str(tmp_path), modes=("sideways",))


async def test_the_router_s_calls_a_request_against_another_version_s(tmp_path: Path) -> None:
    (tmp_path / "specroute").mkdir()
    (tmp_path / "specroute" / "__init__.py").write_text("")
    (tmp_path / "specroute" / "__main__.py").write_text(_ANSWERS_ITSELF)
    plan = CallPlan(str(tmp_path), requests=60, concurrency=6, modes=("whole",))
    notes: list[str] = []
    document = await count_calls(plan, notes.append)
    row = document["modes"]["whole"]
    # the router chooses, calls a backend and relays its answer: more than answering
    assert row["this"] > 1.5 * row["baseline"] > 0
    assert row["ratio"] == pytest.approx(row["this"] / row["baseline"])
    more, fewer = [n for _, n in row["more"]], [n for _, n in row["fewer"]]
    assert len(more) == 10 and more == sorted(more, reverse=True) and more[-1] > 0
    assert fewer == sorted(fewer) and all(n < 0 for n in fewer)
    assert document["plan"]["baseline"] == tmp_path.name  # the folder's name, not its path
    assert len(notes) == 2 and "whole, this" in notes[0]
    assert "whole:" in render(document)
