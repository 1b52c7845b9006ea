"""Before measuring: read both servers' settings and say loudly when the comparison would be
unfair (a speculative SGLang server is capped at 48 running requests unless told
otherwise, which alone can decide the crossover).

SGLang's ``/server_info`` is read as is. vLLM serves its whole configuration there only
with ``VLLM_SERVER_DEV_MODE=1``; it is read from its JSON form into SGLang's names. A vLLM
server without it says only its model and context length (``/v1/models``): the rest cannot
be compared, which is said once, as a note, not as a finding.
"""

from __future__ import annotations

from typing import Any

import aiohttp

_COMPARED = (
    ("model_path", "the two servers serve different models"),
    (
        "max_running_requests",
        "SGLang caps a speculative server at 48 unless "
        "--max-running-requests is given; pass the same value to both "
        "(vLLM: --max-num-seqs)",
    ),
    ("cuda_graph_max_bs", "batches past it run without CUDA graphs, slower on one side only"),
    ("disable_cuda_graph", "CUDA graphs on one side only"),
    ("attention_backend", "different attention kernels run at different speeds"),
    ("prefill_attention_backend", "different prefill attention kernels"),
    ("decode_attention_backend", "different decode attention kernels"),
    ("sampling_backend", "different sampling kernels"),
    ("moe_runner_backend", "different expert kernels"),
    ("device", "the servers run on different devices"),
    ("dtype", "different weight precision"),
    ("quantization", "different quantization"),
    ("kv_cache_dtype", "different KV cache precision"),
    ("tp_size", "different tensor parallelism"),
    ("dp_size", "different data parallelism"),
    ("pp_size", "different pipeline parallelism"),
    ("ep_size", "different expert parallelism"),
    ("enable_dp_attention", "data-parallel attention on one side only"),
    ("context_length", "different context lengths"),
    ("chunked_prefill_size", "prefills are cut into different chunks"),
    ("max_prefill_tokens", "different prefill batch budgets"),
    ("max_total_tokens", "different KV cache sizes: one side may queue or retract sooner"),
    ("mem_fraction_static", "different memory for the KV cache"),
    ("schedule_policy", "different scheduling"),
    ("schedule_conservativeness", "different admission of new requests"),
    ("disable_radix_cache", "prefix caching on one side only"),
    ("enable_torch_compile", "torch.compile on one side only"),
    ("disable_overlap_schedule", "CPU scheduling overlaps the forward pass on one side only"),
    ("stream_interval", "different --stream-interval changes the chunking clients see"),
    (
        "async_scheduling",
        "vLLM overlaps scheduling with the forward pass on one side only "
        "(it does not with n-gram speculation): pass --no-async-scheduling "
        "to the plain server",
    ),
)
PARTIAL = "partial"  # the key of a note on what a server's settings do not say


async def server_info(session: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    """The server's settings in SGLang's names; None from a server that says nothing."""
    info = await _json(session, f"{url}/server_info?config_format=json")
    if isinstance(info, dict) and isinstance(info.get("vllm_config"), dict):
        return _from_vllm(info["vllm_config"]) | await _version(session, url)
    if isinstance(info, dict) and "vllm_config" not in info:
        return {"engine": "sglang"} | _effective_cap(info)  # its version among them
    models = await _json(session, f"{url}/v1/models")
    cards = models.get("data") if isinstance(models, dict) else None
    if not isinstance(cards, list) or not cards or not isinstance(cards[0], dict):
        return None
    card = cards[0]
    return {
        "model_path": card.get("root") or card.get("id"),
        "context_length": card.get("max_model_len"),
        PARTIAL: "its running-request limit and speculation could not be read (a vLLM "
        "server shows them at /server_info with VLLM_SERVER_DEV_MODE=1)",
    } | await _version(session, url)


def _effective_cap(info: dict[str, Any]) -> dict[str, Any]:
    """SGLang's settings with the running cap it chose: ``max_running_requests`` is None
    unless given, and the scheduler's own (``effective_max_running_requests_per_dp``,
    from the memory it has) is in each data-parallel rank's ``internal_states``."""
    if info.get("max_running_requests") is not None:
        return info
    states = info.get("internal_states")
    first = states[0] if isinstance(states, list) and states else None
    cap = first.get("effective_max_running_requests_per_dp") if isinstance(first, dict) else None
    if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
        return info | {"max_running_requests": cap, "max_running_requests_effective": True}
    return info


async def _version(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """vLLM's version, from its ``/version``: the crossover moves with the engine's."""
    found = await _json(session, f"{url}/version")
    version = found.get("version") if isinstance(found, dict) else None
    return {"version": version} if isinstance(version, str) else {}


async def _json(session: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with session.get(url) as r:
            return await r.json(content_type=None) if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def _from_vllm(config: dict[str, Any]) -> dict[str, Any]:
    """vLLM's configuration (``VllmConfig`` as JSON) in the names compared here."""

    def part(name: str) -> dict[str, Any]:
        found = config.get(name)
        return found if isinstance(found, dict) else {}

    model, scheduler = part("model_config"), part("scheduler_config")
    speculative = part("speculative_config")
    return {
        "engine": "vllm",
        "model_path": model.get("model"),
        "context_length": model.get("max_model_len"),
        "max_running_requests": scheduler.get("max_num_seqs"),
        "async_scheduling": bool(scheduler.get("async_scheduling")),
        "tp_size": part("parallel_config").get("tensor_parallel_size"),
        "cuda_graph_max_bs": part("compilation_config").get("max_cudagraph_capture_size"),
        "speculative_algorithm": speculative.get("method"),
        "speculative_num_draft_tokens": speculative.get("num_speculative_tokens"),
    }


def fairness_warnings(spec: dict[str, Any] | None, base: dict[str, Any] | None) -> list[str]:
    """What differs between the two beyond speculation (or what could not be read at all)."""
    if spec is None or base is None:
        missing = " and ".join(n for n, i in (("spec", spec), ("base", base)) if i is None)
        return [f"cannot check fairness: {missing} said nothing of its settings"]
    warnings = []
    for key, why in _COMPARED:
        if key in spec and key in base and spec[key] != base[key]:
            warnings.append(f"{key} differs: spec {spec[key]!r}, base {base[key]!r} ({why})")
    if "speculative_algorithm" in spec and not spec["speculative_algorithm"]:
        warnings.append("the spec server does not speculate (speculative_algorithm is unset)")
    if base.get("speculative_algorithm"):
        warnings.append(f"the base server speculates too ({base['speculative_algorithm']})")
    return warnings


def fairness_notes(spec: dict[str, Any] | None, base: dict[str, Any] | None) -> list[str]:
    """What could not be compared, said once and quietly: no finding, a limit of the check;
    and what the curves measured mean when the speculative server adapts its own depth."""
    notes = [
        f"{name}: {info[PARTIAL]}"
        for name, info in (("spec", spec), ("base", base))
        if info is not None and PARTIAL in info
    ]
    if spec is not None and spec.get("speculative_adaptive") is True:
        notes.append(adaptive_note(spec.get("speculative_adaptive_config")))
    return notes


def adaptive_note(schedule: object) -> str:
    """What a calibration against an adaptive speculative server measures."""
    named = f"its schedule {schedule}" if schedule else "SGLang's default schedule"
    return (
        f"spec: adaptive speculation (--speculative-adaptive, {named}): its depth falls with "
        "its batch, so its curve is the adaptive server's and the crossover measured is where "
        "it stops beating the plain server, not where EAGLE-3 at a fixed depth does; to "
        "route a fixed-depth pair, calibrate a server without --speculative-adaptive"
    )


def banner(warnings: list[str]) -> str:
    rule = "!" * 78
    lines = [rule, "!!! UNFAIR COMPARISON: the crossover measured here may not be the real one"]
    lines += [f"!!!   - {w}" for w in warnings]
    return "\n".join([*lines, rule])
