"""Attention over the paged KV cache, for SGLang's ``intel_amx`` attention backend:
``decode_attention_cpu`` (one new token a request) and ``extend_attention_cpu`` (several:
a prompt, or a speculative step's draft tokens under a tree mask).

Why one query at a time for short extends: greedy speculation must give the plain
server's tokens, and a verify step's query for a token should see the same keys, in the
same order, through the same float operations as the plain server's decode step for
that token did. A verify step is a short extend; a prompt is a long one, computed for
all its queries at once (both servers do the same there).
"""

from __future__ import annotations

import torch  # type: ignore[import-not-found]
from torch import Tensor

_ROW_BY_ROW_MAX = 16  # extends up to this long (verify steps) take the decode path per query


def _unsupported(is_cross_attn: bool, sliding_window: int, sinks: Tensor | None) -> None:
    if is_cross_attn or sliding_window > 0 or sinks is not None:
        raise NotImplementedError(
            "sgl_kernel (specroute's CPU stand-in): cross attention, sliding windows and "
            "attention sinks are not implemented"
        )


def _scores(q: Tensor, k: Tensor, sm_scale: float, logit_cap: float) -> Tensor:
    """q [heads, Lq, dim] against k [kv_heads, Lk, dim]: [kv_heads, group, Lq, Lk] in fp32."""
    kv_heads = k.shape[0]
    grouped = q.float().reshape(kv_heads, -1, q.shape[1], q.shape[2])
    scores = torch.matmul(grouped, k.float().transpose(1, 2).unsqueeze(1)) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    return scores


def _attend(
    q: Tensor, k: Tensor, v: Tensor, sm_scale: float, logit_cap: float, mask: Tensor | None
) -> Tensor:
    """q [Lq, heads, dim], k and v [Lk, kv_heads, dim]; ``mask`` [Lq, Lk], True where a
    query sees a key. Returns [Lq, heads, v_dim] in fp32."""
    scores = _scores(q.transpose(0, 1), k.transpose(0, 1), sm_scale, logit_cap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = torch.matmul(weights, v.float().transpose(0, 1).unsqueeze(1))  # [kvh, g, Lq, vd]
    return out.reshape(-1, q.shape[0], out.shape[-1]).transpose(0, 1)


def decode_attention_cpu(
    query: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k_scale: float,
    v_scale: float,
    output: Tensor,
    key: Tensor | None,
    value: Tensor | None,
    loc: Tensor,
    attn_logits: Tensor,
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    seq_lens: Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool = False,
    sliding_window_size: int = 0,
    encoder_lens: Tensor | None = None,
    sinks: Tensor | None = None,
) -> None:
    """Writes each request's new key and value (if given) at its slot ``loc[i]``, then its
    query against all ``seq_lens[i]`` keys of its row of ``req_to_token``."""
    _unsupported(is_cross_attn, sliding_window_size, sinks)
    if key is not None and value is not None:
        k_cache[loc] = key.to(k_cache.dtype)
        v_cache[loc] = value.to(v_cache.dtype)
    rows, lengths = req_pool_indices.tolist(), seq_lens.tolist()
    for i, (row, length) in enumerate(zip(rows, lengths, strict=True)):
        slots = req_to_token[row, :length].to(torch.int64)
        k, v = _scaled(k_cache[slots], k_scale), _scaled(v_cache[slots], v_scale)
        output[i] = _attend(query[i : i + 1], k, v, sm_scale, logit_cap, None)[0]


def _scaled(cache: Tensor, scale: float) -> Tensor:
    return cache if scale == 1.0 else cache.float() * scale


def extend_attention_cpu(
    q_extend: Tensor,
    k_extend: Tensor | None,
    v_extend: Tensor | None,
    o_extend: Tensor,
    k_buffer: Tensor,
    v_buffer: Tensor,
    k_scale: float,
    v_scale: float,
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    seq_lens: Tensor,
    extend_seq_lens: Tensor,
    extend_start_loc: Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool = False,
    sliding_window_size: int = 0,
    encoder_lens: Tensor | None = None,
    sinks: Tensor | None = None,
    tree_mask: Tensor | None = None,
    is_causal: bool = True,
) -> None:
    """Request i's ``extend_seq_lens[i]`` queries (from ``extend_start_loc[i]``) against its
    ``seq_lens[i]`` keys, the last ones being its own extend tokens, which the backend has
    already written to the cache. A prefix key is seen by every query; an extend key by
    the queries at or after it (causal), or as ``tree_mask`` says: per request an
    ``n x n`` block (n = that request's extend length), True where query i sees token j."""
    _unsupported(is_cross_attn, sliding_window_size, sinks)
    rows, lengths = req_pool_indices.tolist(), seq_lens.tolist()
    extends, starts = extend_seq_lens.tolist(), extend_start_loc.tolist()
    mask_at = 0
    for row, length, n, start in zip(rows, lengths, extends, starts, strict=True):
        slots = req_to_token[row, :length].to(torch.int64)
        k, v = _scaled(k_buffer[slots], k_scale), _scaled(v_buffer[slots], v_scale)
        prefix = length - n
        visible = _visibility(prefix, n, is_causal, tree_mask, mask_at)
        mask_at += n * n
        q = q_extend[start : start + n]
        if n <= _ROW_BY_ROW_MAX:
            for j in range(n):
                seen = visible[j].nonzero().view(-1)
                o_extend[start + j] = _attend(
                    q[j : j + 1], k[seen], v[seen], sm_scale, logit_cap, None
                )[0]
        else:
            o_extend[start : start + n] = _attend(q, k, v, sm_scale, logit_cap, visible)


def _visibility(
    prefix: int, n: int, is_causal: bool, tree_mask: Tensor | None, mask_at: int
) -> Tensor:
    """[n, prefix + n] bool: which keys each of a request's n queries sees."""
    seen = torch.ones((n, prefix + n), dtype=torch.bool)
    if tree_mask is not None:
        seen[:, prefix:] = tree_mask.view(-1)[mask_at : mask_at + n * n].view(n, n).bool()
    elif is_causal:
        seen[:, prefix:] = torch.ones((n, n), dtype=torch.bool).tril()
    return seen
