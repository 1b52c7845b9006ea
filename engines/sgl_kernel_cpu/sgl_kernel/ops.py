"""The ops SGLang reaches through ``torch.ops.sgl_kernel``, registered under that
namespace with the argument lists SGLang 0.5.23's CPU attention backend passes."""

from __future__ import annotations

import torch  # type: ignore[import-not-found]

from .attention import decode_attention_cpu, extend_attention_cpu

_SCHEMAS = {
    "decode_attention_cpu": (
        "decode_attention_cpu(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "float k_scale, float v_scale, Tensor(c!) output, Tensor? key, Tensor? value, "
        "Tensor loc, Tensor attn_logits, Tensor req_to_token, Tensor req_pool_indices, "
        "Tensor seq_lens, float sm_scale, float logit_cap, bool is_cross_attn, "
        "int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()",
        decode_attention_cpu,
    ),
    "extend_attention_cpu": (
        "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, "
        "Tensor(a!) o_extend, Tensor k_buffer, Tensor v_buffer, float k_scale, "
        "float v_scale, Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
        "Tensor extend_seq_lens, Tensor extend_start_loc, int max_len_extend, "
        "float sm_scale, float logit_cap, bool is_cross_attn, int sliding_window_size, "
        "Tensor? encoder_lens, Tensor? sinks, Tensor? tree_mask, bool is_causal) -> ()",
        extend_attention_cpu,
    ),
}


def register() -> torch.library.Library:
    """Define and implement the ops; the library must stay referenced while they are used."""
    library = torch.library.Library("sgl_kernel", "DEF")
    for name, (schema, function) in _SCHEMAS.items():
        library.define(schema)
        library.impl(name, function, "CPU")
    return library
