"""The memory sections of the shipped hardware models (``emulator.memory``), from each
model's shape and each GPU's size; the JSON files carry them, and
``tests/emulator/test_memory.py`` holds the files to these.

GPUs, as the device reports its memory (NVIDIA's product pages give decimal GB): H100 SXM
81,559 MiB, H200 143,771 MiB, RTX PRO 6000 Blackwell 97,887 MiB. Memory taken before the
weights load (CUDA context, NCCL's buffers) is assumed: 0.5 GiB on one GPU, 1 GiB each with
tensor parallelism over 8.
"""

from __future__ import annotations

from typing import Any

GIB = float(1 << 30)
H100_GIB = 81559 / 1024
H200_GIB = 143771 / 1024
RTX_PRO_6000_GIB = 97887 / 1024


def _gqa(layers: int, kv_heads: int) -> dict[str, int]:
    """A grouped-query attention's KV shape: heads of 128, bf16."""
    return {
        "layers": layers,
        "kv_heads": kv_heads,
        "head_dim": 128,
        "v_head_dim": 128,
        "dtype_bytes": 2,
    }


def _eagle3_head_params(hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int) -> int:
    """An EAGLE-3 head: one decoder layer whose attention reads two hidden states (the token's
    and the fused one), the fc that fuses three target hidden states, a 32,000-token LM head."""
    attention = 2 * hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    return attention + 3 * hidden * ffn + 3 * hidden * hidden + 32000 * hidden


def _section(
    gpu_gib: float,
    context_gib: float,
    weights_gib: float,
    draft_gib: float,
    kv: tuple[dict[str, int], dict[str, int]],
    source: str,
) -> dict[str, Any]:
    return {
        "gpu_gib": round(gpu_gib, 3),
        "context_gib": context_gib,
        "target_weights_gib": round(weights_gib, 3),
        "draft_weights_gib": round(draft_gib, 3),
        "target_kv": kv[0],
        "draft_kv": kv[1],
        "source": source,
    }


def llama_3_1_8b(gpu_gib: float) -> dict[str, Any]:
    params = 8_030_261_248  # Llama-3.1-8B's model card
    draft = _eagle3_head_params(4096, 32, 8, 128, 14336)
    source = (
        "Llama-3.1-8B-Instruct's config (32 layers, 8 KV heads of 128, bf16) and parameter "
        f"count ({params:,}), at TP 1; the EAGLE-3 head's weights estimated from its shape "
        f"({draft:,} parameters: one layer of the target's attention and FFN 14,336, the fc "
        "fusing three hidden states, a 32,000-token LM head), bf16."
    )
    return _section(
        gpu_gib, 0.5, params * 2 / GIB, draft * 2 / GIB, (_gqa(32, 8), _gqa(1, 8)), source
    )


def qwen3_30b_a3b(gpu_gib: float) -> dict[str, Any]:
    params = 30_532_122_624  # Qwen3-30B-A3B's model card: 30.5B
    draft = _eagle3_head_params(2048, 32, 4, 128, 6144)
    source = (
        "Qwen3-30B-A3B's config (48 layers, 4 KV heads of 128, bf16) and parameter count "
        f"({params:,}), at TP 1; the EAGLE-3 head's weights estimated from its shape "
        f"({draft:,} parameters: one layer of 32 query and 4 KV heads, FFN 6,144, the fc, a "
        "32,000-token LM head), bf16."
    )
    return _section(
        gpu_gib, 0.5, params * 2 / GIB, draft * 2 / GIB, (_gqa(48, 4), _gqa(1, 4)), source
    )


def kimi_k2_5(gpu_gib: float, tp: int = 8) -> dict[str, Any]:
    weights_gb = 595  # the INT4 checkpoint's size (deploy/sglang/node.env)
    draft = _eagle3_head_params(7168, 64, 8, 128, 18432)
    source = (
        "Kimi-K2.5's INT4 checkpoint (595 GB) spread evenly over TP 8 (the MLA "
        "down-projections each GPU holds whole are not counted apart); its MLA latent "
        "(kv_lora_rank 512 + qk_rope_head_dim 64, 61 layers, bf16), held whole on every GPU; "
        f"the EAGLE-3 head's weights estimated from its shape ({draft:,} parameters), bf16, "
        "over TP 8, and its KV one head of 128 on each GPU."
    )
    latent = {"layers": 61, "latent": 576, "dtype_bytes": 2}
    weights = weights_gb * 1e9 / tp / GIB
    return _section(gpu_gib, 1.0, weights, draft * 2 / tp / GIB, (latent, _gqa(1, 8)), source)
