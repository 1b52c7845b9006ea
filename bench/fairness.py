"""Before measuring: read both servers' ``/server_info`` and say loudly when the comparison
would be unfair (a speculative SGLang server is capped at 48 running requests unless told
otherwise, which alone can decide the crossover)."""

from __future__ import annotations

from typing import Any

import aiohttp

_COMPARED = (
    ("model_path", "the two servers serve different models"),
    ("max_running_requests", "SGLang caps a speculative server at 48 unless "
                             "--max-running-requests is given; pass the same value to both"),
    ("cuda_graph_max_bs", "batches past it run without CUDA graphs, slower on one side only"),
    ("tp_size", "different tensor parallelism"),
    ("context_length", "different context lengths"),
    ("stream_interval", "different --stream-interval changes the chunking clients see"),
)  # fmt: skip


async def server_info(session: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    """SGLang's ``/server_info``; None from servers without it (vLLM)."""
    try:
        async with session.get(f"{url}/server_info") as r:
            if r.status != 200:
                return None
            info = await r.json()
            return info if isinstance(info, dict) else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def fairness_warnings(spec: dict[str, Any] | None, base: dict[str, Any] | None) -> list[str]:
    if spec is None or base is None:
        missing = " and ".join(n for n, i in (("spec", spec), ("base", base)) if i is None)
        return [f"cannot check fairness: no /server_info from {missing}"]
    warnings = []
    for key, why in _COMPARED:
        if key in spec and key in base and spec[key] != base[key]:
            warnings.append(f"{key} differs: spec {spec[key]!r}, base {base[key]!r} ({why})")
    if not spec.get("speculative_algorithm"):
        warnings.append("the spec server does not speculate (speculative_algorithm is unset)")
    if base.get("speculative_algorithm"):
        warnings.append(f"the base server speculates too ({base['speculative_algorithm']})")
    return warnings


def banner(warnings: list[str]) -> str:
    rule = "!" * 78
    lines = [rule, "!!! UNFAIR COMPARISON: the crossover measured here may not be the real one"]
    lines += [f"!!!   - {w}" for w in warnings]
    return "\n".join([*lines, rule])
