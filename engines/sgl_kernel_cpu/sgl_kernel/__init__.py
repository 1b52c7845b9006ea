"""specroute's stand-in for SGLang's kernel package (``sgl_kernel``) on a CPU without AMX:
the ops that a plain SGLang 0.5.23 server and a speculative one (NGRAM, EAGLE-3) call on
the CPU engine with the ``intel_amx`` attention backend, written in PyTorch.

SGLang imports many more names from ``sgl_kernel`` than such a server calls (it imports
per platform, not per model). Any other name imports as a function that raises when
called, naming itself: an op this package lacks fails loudly at the call that needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from .attention import decode_attention_cpu, extend_attention_cpu
from .cache import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    copy_all_layer_kv_cache_cpu,
    fill_accept_out_cache_loc_cpu,
)
from .ops import register
from .tree import (
    build_tree_kernel_efficient_cpu,
    fill_bonus_tokens_cpu,
    reconstruct_indices_from_tree_mask,
    verify_tree_greedy_cpu,
)

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "decode_attention_cpu",
    "extend_attention_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask",
    "verify_tree_greedy_cpu",
]

_LIBRARY = register()


def missing(name: str) -> Callable[..., NoReturn]:
    def unimplemented(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"sgl_kernel.{name}: not implemented by specroute's CPU stand-in")

    unimplemented.__name__ = name
    return unimplemented


def __getattr__(name: str) -> Callable[..., NoReturn]:
    if name.startswith("__"):
        raise AttributeError(name)
    return missing(name)
