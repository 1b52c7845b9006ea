"""Where each request's tokens live in the KV cache: the ops that move slot numbers between
``req_to_token`` (one row of slots per request) and the flat ``out_cache_loc`` lists a
forward pass writes to, and the one that copies whole cache rows between slots.

Each takes its arguments in the order SGLang's CPU engine passes them and writes its
outputs in place. Slot lists are short (a batch's new tokens), so plain loops over the
batch cost less than building index tensors for a vectorised form.
"""

from __future__ import annotations

import ctypes

import torch  # type: ignore[import-not-found]
from torch import Tensor


def _lengths(start: Tensor, end: Tensor) -> list[tuple[int, int]]:
    return list(zip(start.tolist(), end.tolist(), strict=True))


def assign_req_to_token_pool_cpu(
    req_pool_indices: Tensor,
    req_to_token: Tensor,
    start_offset: Tensor,
    end_offset: Tensor,
    out_cache_loc: Tensor,
    pool_len: int,
) -> None:
    """Request i's row gets the next ``end - start`` slots of ``out_cache_loc`` (taken in
    order across the batch) at columns ``start:end``."""
    taken = 0
    for row, (start, end) in zip(
        req_pool_indices.tolist(), _lengths(start_offset, end_offset), strict=True
    ):
        req_to_token[row, start:end] = out_cache_loc[taken : taken + end - start].to(
            req_to_token.dtype
        )
        taken += end - start


def assign_extend_cache_locs_cpu(
    req_pool_indices: Tensor,
    req_to_token: Tensor,
    start_offset: Tensor,
    end_offset: Tensor,
    out_cache_loc: Tensor,
    pool_len: int,
) -> None:
    """The reverse: the slots at columns ``start:end`` of each request's row, one request
    after another, into ``out_cache_loc``."""
    parts = [
        req_to_token[row, start:end]
        for row, (start, end) in zip(
            req_pool_indices.tolist(), _lengths(start_offset, end_offset), strict=True
        )
    ]
    if parts:
        joined = torch.cat(parts)
        out_cache_loc[: joined.numel()] = joined.to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: Tensor,
    req_to_token: Tensor,
    seq_lens: Tensor,
    out_cache_loc: Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """The ``topk * num_steps`` slots reserved for drafts right after each request's
    committed tokens, request after request."""
    width = topk * num_steps
    for i, (row, start) in enumerate(
        zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)
    ):
        out_cache_loc[i * width : (i + 1) * width] = req_to_token[row, start : start + width]


def build_draft_decode_metadata_cpu(
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    seq_lens: Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> Tensor:
    """A ``req_to_token`` for the draft's decode steps: row ``b * topk + k`` is request b's
    committed slots followed by candidate k's ``num_steps`` draft slots (which were laid
    out after the committed ones, candidate after candidate)."""
    rows = req_pool_indices.numel() * topk
    out = torch.zeros((rows, pool_len), dtype=req_to_token.dtype)
    for b, (row, length) in enumerate(
        zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)
    ):
        source = req_to_token[row]
        for k in range(topk):
            target = out[b * topk + k]
            target[:length] = source[:length]
            first = length + k * num_steps
            target[length : length + num_steps] = source[first : first + num_steps]
    return out


def fill_accept_out_cache_loc_cpu(
    accept_index: Tensor,
    out_cache_loc: Tensor,
    accept_out_cache_loc: Tensor,
    size: int | None = None,
) -> None:
    """The slots of the accepted tokens, in order; -1 in ``accept_index`` is a rejected
    token and is skipped. ``size``: how many entries of ``accept_index`` to read (all when
    not given, as SGLang 0.5.23 calls it)."""
    index = accept_index.reshape(-1)[:size].to(torch.int64)
    kept = out_cache_loc[index[index >= 0]]
    accept_out_cache_loc[: kept.numel()] = kept


def copy_all_layer_kv_cache_cpu(
    data_ptrs: Tensor, strides: Tensor, tgt_loc: Tensor, src_loc: Tensor
) -> None:
    """Row ``src`` to row ``tgt`` of every cache buffer, given as raw addresses and row
    sizes in bytes (how SGLang hands over all layers' buffers at once). All sources are
    read before any target is written, as the parallel GPU kernel would see them."""
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist(), strict=True))
    for base, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        rows = [ctypes.string_at(base + src * stride, stride) for _, src in pairs]
        for (tgt, _), row in zip(pairs, rows, strict=True):
            ctypes.memmove(base + tgt * stride, row, stride)
