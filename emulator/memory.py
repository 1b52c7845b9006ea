"""A server's KV cache, as SGLang 0.5.23 sizes it from GPU memory, and how its scheduler lives
within it.

Sizing (``mem_cache/kv_cache_configurator.py``, ``model_executor/pool_configurator.py``):
the memory free on each GPU before the weights load (``pre``) times ``mem_fraction_static``
is what the weights and the KV cache may take; what the weights leave of it, over the bytes
one token's KV takes on one GPU in every layer (the target's and, on a speculative server,
the draft's), is ``max_total_num_tokens``. A token's bytes: for grouped-query attention
``max(1, kv_heads // tp) x (head_dim + v_head_dim) x layers x dtype bytes`` (each GPU holds
its share of the heads); for multi-head latent attention ``(kv_lora_rank +
qk_rope_head_dim) x layers x dtype bytes`` (every GPU holds the whole latent). Weights
that leave nothing refuse the start, as SGLang does.

``mem_fraction_static``'s default (``arg_groups/memory_hook.py``) reserves, in MiB, 512 plus
1.5 per token of a chunked prefill (8,192), plus ``tp / 8 x 1024``, plus 2 per batch size of
the largest decode CUDA graph, at least 10 GiB on a GPU of more than 60 GiB; the rest of the
GPU, as a share of it, rounded to three places. (SGLang adds the prefill CUDA graphs'
reserve where they are captured, which this does not: state the fraction where it matters.)

Servers that share GPUs each find free what those started before them left (``taken``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GIB = float(1 << 30)
CHUNKED_PREFILL = 8192


class KvCacheError(ValueError):
    """Memory that cannot hold the model, said as SGLang says it."""


@dataclass(frozen=True)
class KvShape:
    """What one token's KV takes in one model's layers."""

    layers: int
    dtype_bytes: int
    kv_heads: int = 0  # grouped-query attention
    head_dim: int = 0
    v_head_dim: int = 0
    latent: int = 0  # multi-head latent attention: kv_lora_rank + qk_rope_head_dim

    def bytes_per_token(self, tp: int) -> int:
        """On one of ``tp`` GPUs."""
        if self.latent:
            return self.latent * self.layers * self.dtype_bytes
        heads = max(1, self.kv_heads // tp)
        return heads * (self.head_dim + self.v_head_dim) * self.layers * self.dtype_bytes


@dataclass(frozen=True)
class Memory:
    """One model's memory on one GPU type: the GPU's, the weights' on each GPU, the KV's."""

    gpu_gib: float  # each GPU's memory, as the device reports it
    context_gib: float  # taken on each GPU before the weights load (CUDA context, NCCL)
    target_weights_gib: float  # on each GPU, at the model's tensor parallelism
    draft_weights_gib: float
    target: KvShape
    draft: KvShape

    def bytes_per_token(self, tp: int, speculative: bool) -> int:
        draft = self.draft.bytes_per_token(tp) if speculative else 0
        return self.target.bytes_per_token(tp) + draft

    def weights_gib(self, speculative: bool) -> float:
        return self.target_weights_gib + (self.draft_weights_gib if speculative else 0.0)


def default_fraction(gpu_gib: float, tp: int, cuda_graph_max_bs: int) -> float:
    """SGLang's ``mem_fraction_static`` when none is given (see the module's note), on GPUs
    of ``gpu_gib`` each."""
    gpu_mib = gpu_gib * 1024
    reserved = 512 + max(CHUNKED_PREFILL, 2048) * 1.5 + tp / 8 * 1024 + cuda_graph_max_bs * 2
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def shared_fractions(fraction: float) -> tuple[float, float]:
    """``--mem-fraction-static`` for two servers started one after the other on the same
    GPUs (the shared topology), for each to hold the same memory and keep for itself the
    reserve that ``fraction``, one server's, keeps: the first's of the memory free at its
    start, the second's of what the first left."""
    share = fraction - 0.5  # each: half of what two reserves leave
    if share <= 0:
        raise KvCacheError(
            f"two servers that each keep the reserve of --mem-fraction-static={fraction} "
            "leave no memory for either's weights"
        )
    return round(share, 3), round(share / (1 - share), 3)


def token_capacity(
    memory: Memory, tp: int, fraction: float, speculative: bool, taken_gib: float = 0.0
) -> int:
    """``max_total_num_tokens``: what ``fraction`` of the memory free before the weights
    load leaves for the KV cache, in tokens. ``taken_gib``: each GPU's memory that servers
    started before this one hold."""
    pre = memory.gpu_gib - memory.context_gib - taken_gib
    rest = pre * fraction - memory.weights_gib(speculative)
    if rest <= 0:
        minimum = 1 - (pre - memory.weights_gib(speculative)) / pre
        raise KvCacheError(
            "Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={fraction}. Raise --mem-fraction-static above "
            f"{math.ceil(minimum * 1000) / 1000:.3f}"
        )
    return int(rest * GIB // memory.bytes_per_token(tp, speculative))


def static_gib(memory: Memory, fraction: float, taken_gib: float = 0.0) -> float:
    """Each GPU's memory a server holds from its start on (weights and KV cache), for those
    that start after it on the same GPUs."""
    return (memory.gpu_gib - memory.context_gib - taken_gib) * fraction + memory.context_gib


def parse_memory(data: Any) -> Memory | None:
    """A hardware model's ``memory`` section, or None where it has none."""
    if data is None:
        return None
    return Memory(
        gpu_gib=float(data["gpu_gib"]),
        context_gib=float(data["context_gib"]),
        target_weights_gib=float(data["target_weights_gib"]),
        draft_weights_gib=float(data["draft_weights_gib"]),
        target=KvShape(**data["target_kv"]),
        draft=KvShape(**data["draft_kv"]),
    )
