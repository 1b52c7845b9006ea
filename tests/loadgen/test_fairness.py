"""The fairness check reads SGLang's and vLLM's settings alike (servers on loopback)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
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


async def test_sglangs_own_cap_is_read_where_its_arguments_leave_it_unset() -> None:
    """A plain SGLang server given no ``--max-running-requests`` says None in its arguments;
    the cap its scheduler chose is in ``internal_states``, and that is what is compared."""
    async with (
        running_emulator("--mode", "spec") as spec_url,
        running_emulator("--mode", "base") as base_url,
        aiohttp.ClientSession() as session,
    ):
        async with session.get(f"{base_url}/server_info") as r:
            assert (await r.json())["max_running_requests"] is None
        spec = await server_info(session, spec_url)
        base = await server_info(session, base_url)
    assert spec is not None and base is not None
    assert (spec["max_running_requests"], base["max_running_requests"]) == (48, 512)
    assert spec["engine"] == base["engine"] == "sglang"  # its /server_info names no engine
    assert base["max_running_requests_effective"] is True
    assert "max_running_requests_effective" not in spec  # its arguments said 48
    assert fairness_warnings(spec, base)[0].startswith("max_running_requests differs")


SGLANG = {
    "model_path": "/models/tiny",
    "speculative_algorithm": "NGRAM",
    "max_running_requests": 64,
    "attention_backend": "intel_amx",
    "dtype": "bfloat16",
    "chunked_prefill_size": 8192,
}


@pytest.mark.parametrize(
    ("base_differs", "said"),
    [
        ({"attention_backend": "torch_native"}, "attention_backend differs: spec 'intel_amx', "),
        ({"dtype": "float16"}, "dtype differs"),
        ({"chunked_prefill_size": 4096}, "chunked_prefill_size differs"),
        ({"kv_cache_dtype": "fp8_e4m3"}, None),  # said by one side only: not compared
    ],
    ids=["attention backend", "dtype", "prefill chunks", "one side only"],
)
def test_every_setting_that_changes_speed_is_compared(
    base_differs: dict[str, Any], said: str | None
) -> None:
    base = SGLANG | {"speculative_algorithm": None} | base_differs
    warnings = fairness_warnings(SGLANG, base)
    if said is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and warnings[0].startswith(said)
