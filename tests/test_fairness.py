"""The fairness check reads SGLang's and vLLM's settings alike (servers on loopback)."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web

from specroute.loadgen.fairness import fairness_notes, fairness_warnings, server_info
from tests.apps import serving
from tests.emulators import running_emulator


def vllm(max_num_seqs: int, speculative: dict[str, Any] | None, dev_mode: bool) -> web.Application:
    """A vLLM-shaped server: its configuration at ``/server_info`` (as vLLM 0.32 serves it with
    ``VLLM_SERVER_DEV_MODE=1``, asked for as JSON), its model card at ``/v1/models``."""
    config = {
        "model_config": {"model": "/models/tiny", "max_model_len": 2048},
        "scheduler_config": {"max_num_seqs": max_num_seqs, "async_scheduling": not speculative},
        "parallel_config": {"tensor_parallel_size": 1},
        "speculative_config": speculative,
        "compilation_config": {"max_cudagraph_capture_size": None},
    }

    async def info(request: web.Request) -> web.Response:
        if request.query.get("config_format") != "json":
            return web.json_response({"vllm_config": "model='/models/tiny', ..."})
        return web.json_response({"vllm_config": config, "vllm_env": {}, "system_env": {}})

    async def models(request: web.Request) -> web.Response:
        card = {"id": "tiny", "root": "/models/tiny", "max_model_len": 2048}
        return web.json_response({"object": "list", "data": [card]})

    app = web.Application()
    if dev_mode:
        app.router.add_get("/server_info", info)
    app.router.add_get("/v1/models", models)
    return app


NGRAM = {"method": "ngram", "num_speculative_tokens": 3}


async def infos(spec: web.Application, base: web.Application) -> list[dict[str, Any] | None]:
    async with serving(spec) as s, serving(base) as b, aiohttp.ClientSession() as session:
        return [await server_info(session, s), await server_info(session, b)]


async def test_vllm_in_dev_mode_is_read_from_its_config() -> None:
    spec, base = await infos(vllm(64, NGRAM, True), vllm(32, None, True))
    assert spec is not None and spec["speculative_algorithm"] == "ngram"
    warnings = fairness_warnings(spec, base)
    assert any(w.startswith("max_running_requests differs: spec 64, base 32") for w in warnings)
    assert any(w.startswith("async_scheduling differs") for w in warnings)
    assert not any("does not speculate" in w for w in warnings)
    assert fairness_notes(spec, base) == []


async def test_vllm_alike_but_for_speculation_is_fair() -> None:
    spec = vllm(32, NGRAM, True)
    base = vllm(32, None, True)
    found = await infos(spec, base)
    found[1] = (found[1] or {}) | {"async_scheduling": False}  # --no-async-scheduling
    assert fairness_warnings(*found) == []


async def test_vllm_without_dev_mode_is_a_note_not_a_finding() -> None:
    spec, base = await infos(vllm(64, NGRAM, False), vllm(32, None, False))
    assert spec == base and spec is not None and spec["model_path"] == "/models/tiny"
    assert fairness_warnings(spec, base) == []
    notes = fairness_notes(spec, base)
    assert len(notes) == 2 and "VLLM_SERVER_DEV_MODE=1" in notes[0]


async def test_sglang_is_read_as_it_is() -> None:
    async with (
        running_emulator("--mode", "spec", "--max-running-requests", "64") as spec_url,
        running_emulator("--mode", "base", "--max-running-requests", "32") as base_url,
        aiohttp.ClientSession() as session,
    ):
        spec = await server_info(session, spec_url)
        base = await server_info(session, base_url)
    assert spec is not None and spec["speculative_algorithm"] == "EAGLE3"
    assert any(w.startswith("max_running_requests differs") for w in fairness_warnings(spec, base))
    assert fairness_notes(spec, base) == []
