"""What each op of the project's ``sgl_kernel`` stand-in must do, case by case, on small
inputs whose answers are worked out by hand or by PyTorch's own attention.

Runs in the SGLang environment (``.venv-sglang-cpu``, where ``sgl_kernel`` and torch are):
``tests/engines/test_sglang_kernel.py`` runs it as a script and reads one JSON line, the outcome
of every ``case_*`` function by name.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable

import sgl_kernel  # type: ignore[import-not-found]
import torch  # type: ignore[import-not-found]
import torch.nn.functional as F  # type: ignore[import-not-found]
from torch import Tensor

I32, I64 = torch.int32, torch.int64

# A draft tree of four nodes: 0 the root; 1 and 2 its children; 3 the child of 1.
TREE_MASK = torch.tensor(
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool
).reshape(-1)


def case_assign_req_to_token_pool_takes_slots_in_order() -> None:
    table = torch.zeros((3, 8), dtype=I32)
    sgl_kernel.assign_req_to_token_pool_cpu(
        torch.tensor([2, 0]),
        table,
        torch.tensor([1, 0]),
        torch.tensor([3, 3]),
        torch.tensor([10, 11, 20, 21, 22], dtype=I64),
        8,
    )
    assert table[2].tolist() == [0, 10, 11, 0, 0, 0, 0, 0]
    assert table[0].tolist() == [20, 21, 22, 0, 0, 0, 0, 0]


def case_assign_extend_cache_locs_reads_them_back() -> None:
    table = torch.arange(24, dtype=I32).reshape(3, 8)
    out = torch.full((5,), -1, dtype=I64)
    sgl_kernel.assign_extend_cache_locs_cpu(
        torch.tensor([2, 0]), table, torch.tensor([1, 5]), torch.tensor([3, 8]), out, 8
    )
    assert out.tolist() == [17, 18, 5, 6, 7]


def case_assign_draft_cache_locs_contiguous_reads_the_slots_after_the_committed() -> None:
    table = torch.arange(40, dtype=I32).reshape(2, 20)
    out = torch.zeros(2 * 2 * 3, dtype=I64)
    sgl_kernel.assign_draft_cache_locs_contiguous_cpu(
        torch.tensor([1, 0]), table, torch.tensor([4, 2]), out, 20, 2, 3
    )
    assert out.tolist() == [24, 25, 26, 27, 28, 29, 2, 3, 4, 5, 6, 7]


def case_build_draft_decode_metadata_gives_each_candidate_its_own_row() -> None:
    table = torch.arange(20, dtype=I32).reshape(1, 20)
    rows = sgl_kernel.build_draft_decode_metadata_cpu(
        table, torch.tensor([0]), torch.tensor([3]), 2, 2, 20
    )
    assert rows.shape == (2, 20)
    assert rows[0, :5].tolist() == [0, 1, 2, 3, 4]  # committed, then candidate 0's slots
    assert rows[1, :5].tolist() == [0, 1, 2, 5, 6]  # committed, then candidate 1's


def case_fill_accept_out_cache_loc_skips_rejected_tokens() -> None:
    out = torch.zeros(3, dtype=I64)
    loc = torch.tensor([100, 101, 102, 103, 104, 105], dtype=I64)
    accepted = torch.zeros(4, dtype=I64)
    sgl_kernel.fill_accept_out_cache_loc_cpu(
        torch.tensor([0, 2, -1, 3, 5, -1], dtype=I32), loc, accepted
    )
    assert accepted.tolist() == [100, 102, 103, 105]
    sgl_kernel.fill_accept_out_cache_loc_cpu(torch.tensor([4, -1, 1], dtype=I32), loc, out, 2)
    assert out.tolist() == [104, 0, 0]


def case_copy_all_layer_kv_cache_reads_every_source_before_writing() -> None:
    layers = [torch.arange(12, dtype=torch.bfloat16).reshape(4, 3) + 100 * i for i in range(2)]
    ptrs = torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64)
    strides = torch.tensor([t.stride(0) * t.element_size() for t in layers])
    before = [t.clone() for t in layers]
    sgl_kernel.copy_all_layer_kv_cache_cpu(
        ptrs, strides, torch.tensor([1, 2]), torch.tensor([2, 1])
    )
    for now, then in zip(layers, before, strict=True):  # rows 1 and 2 swapped, no others
        assert torch.equal(now[[0, 2, 1, 3]], then)


def case_reconstruct_indices_from_tree_mask_links_the_tree() -> None:
    n = 4
    mask = torch.cat([TREE_MASK, torch.eye(n, dtype=torch.bool).reshape(-1)])  # 2nd: no links
    outs = [torch.zeros(2 * n, dtype=I64) for _ in range(4)]
    positions, index, child, sibling = outs
    sgl_kernel.reconstruct_indices_from_tree_mask(mask, torch.tensor([10, 5]), *outs, 2, n)
    assert positions.tolist() == [10, 11, 11, 12, 5, 5, 5, 5]
    assert index.tolist() == list(range(8))
    assert child.tolist() == [1, 3, -1, -1, -1, -1, -1, -1]
    assert sibling.tolist() == [-1, 2, -1, -1, -1, -1, -1, -1]


def case_verify_tree_greedy_accepts_the_path_the_target_agrees_with() -> None:
    candidates = torch.tensor([[7, 8, 9, 5]])  # root 7; node 1 says 8, node 2 says 9, node 3 5
    index = torch.tensor([[0, 1, 2, 3]])
    child, sibling = torch.tensor([[1, 3, -1, -1]]), torch.tensor([[-1, 2, -1, -1]])
    # after the root the target says 9 (node 2, a sibling), after node 2 it says 4
    target = torch.tensor([[9, 1, 4, 2]])
    predicts = torch.zeros(4, dtype=I32)
    accept = torch.full((1, 3), -1, dtype=I32)
    accepted = torch.zeros(1, dtype=I32)
    sgl_kernel.verify_tree_greedy_cpu(
        predicts=predicts,
        accept_index=accept,
        accept_token_num=accepted,
        candidates=candidates,
        retrive_index=index,
        retrive_next_token=child,
        retrive_next_sibling=sibling,
        target_predict=target,
    )
    assert accept.tolist() == [[0, 2, -1]]
    assert accepted.tolist() == [1]
    assert predicts.tolist() == [9, 0, 4, 0]  # the accepted draft, then the bonus token


def case_build_tree_kernel_efficient_builds_an_eagle_chain() -> None:
    n = 4  # top-1 drafts of 3 steps: each draft's parent is the one before
    mask = torch.ones(n * n, dtype=torch.bool)
    outs = [torch.full((1, n), -1, dtype=I64) for _ in range(3)]
    positions = torch.zeros(n, dtype=I64)
    sgl_kernel.build_tree_kernel_efficient_cpu(
        torch.tensor([[-1, 0, 1]]),
        torch.tensor([[0, 1, 2]]),
        torch.tensor([6]),
        mask,
        positions,
        *outs,
        1,
        3,
        n,
        1,
    )
    index, child, sibling = outs
    assert positions.tolist() == [6, 7, 8, 9]
    assert index.tolist() == [[0, 1, 2, 3]] and child.tolist() == [[1, 2, 3, -1]]
    assert sibling.tolist() == [[-1, -1, -1, -1]]
    assert torch.equal(mask.view(n, n), torch.ones(n, n, dtype=torch.bool).tril())
    # the NGRAM reconstruction reads the same tree back from the mask
    back = [torch.zeros(n, dtype=I64) for _ in range(4)]
    sgl_kernel.reconstruct_indices_from_tree_mask(mask, torch.tensor([6]), *back, 1, n)
    assert back[0].tolist() == positions.tolist() and back[2].tolist() == child[0].tolist()


def case_build_tree_kernel_efficient_branches_a_top_2_tree() -> None:
    n = 4  # top-2, 2 steps: node 1, 2 are the root's drafts 0, 1; node 3 is draft 2's (under 0)
    mask = torch.ones(n * n, dtype=torch.bool)
    outs = [torch.full((1, n), -1, dtype=I64) for _ in range(3)]
    positions = torch.zeros(n, dtype=I64)
    sgl_kernel.build_tree_kernel_efficient_cpu(
        torch.tensor([[-1, 0, 1]]),
        torch.tensor([[0, 1, 2]]),
        torch.tensor([3]),
        mask,
        positions,
        *outs,
        2,
        2,
        n,
        1,
    )
    _, child, sibling = outs
    assert child.tolist() == [[1, 3, -1, -1]] and sibling.tolist() == [[-1, 2, -1, -1]]
    assert positions.tolist() == [3, 4, 4, 5]
    assert torch.equal(mask, TREE_MASK)


def case_fill_bonus_tokens_takes_each_rows_last_accepted() -> None:
    bonus = torch.zeros(2, dtype=I32)
    tokens = torch.tensor([[5, 6, 7], [8, 9, 10]], dtype=I32)
    sgl_kernel.fill_bonus_tokens_cpu(tokens, torch.tensor([2, 3], dtype=I32), bonus, 3)
    assert bonus.tolist() == [6, 10]


def _reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """PyTorch's attention: q [Lq, H, D], k and v [Lk, Hkv, D], mask [Lq, Lk]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).float(), k.transpose(0, 1).float(), v.transpose(0, 1).float(), mask
    )
    return out.transpose(0, 1)


def _cache(tokens: int, kv_heads: int = 2, dim: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(tokens, kv_heads, dim), torch.randn(tokens, kv_heads, dim)


def _decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    key: Tensor | None,
    value: Tensor | None,
    loc: Tensor,
    table: Tensor,
    rows: Tensor,
    lens: Tensor,
) -> Tensor:
    out = torch.zeros(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype)
    torch.ops.sgl_kernel.decode_attention_cpu(
        q,
        k_cache,
        v_cache,
        1.0,
        1.0,
        out,
        key,
        value,
        loc,
        torch.zeros(1),
        table,
        rows,
        lens,
        0.25,
        0.0,
        False,
        0,
        None,
        None,
    )
    return out


def case_decode_attention_writes_the_new_key_and_attends_with_grouped_heads() -> None:
    k_cache, v_cache = _cache(32)
    table = torch.arange(32, dtype=I32).reshape(2, 16)
    q = torch.randn(2, 4, 16)  # 4 query heads on 2 kv heads
    key, value = torch.randn(2, 2, 16), torch.randn(2, 2, 16)
    loc = torch.tensor([16 + 4, 5])  # request 0 is row 1 with 5 tokens, request 1 row 0 with 6
    out = _decode(
        q, k_cache, v_cache, key, value, loc, table, torch.tensor([1, 0]), torch.tensor([5, 6])
    )
    assert torch.equal(k_cache[20], key[0]) and torch.equal(v_cache[5], value[1])
    for i, (start, length) in enumerate([(16, 5), (0, 6)]):
        ks, vs = k_cache[start : start + length], v_cache[start : start + length]
        expected = _reference(q[i : i + 1] * 1.0, ks, vs, torch.ones(1, length, dtype=torch.bool))
        torch.testing.assert_close(out[i], expected[0] * 1.0, rtol=1e-5, atol=1e-5)


def _extend(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    table: Tensor,
    lens: list[int],
    extends: list[int],
    starts: list[int],
    tree_mask: Tensor | None,
) -> Tensor:
    out = torch.zeros_like(q)
    torch.ops.sgl_kernel.extend_attention_cpu(
        q,
        None,
        None,
        out,
        k_cache,
        v_cache,
        1.0,
        1.0,
        table,
        torch.arange(len(lens)),
        torch.tensor(lens),
        torch.tensor(extends),
        torch.tensor(starts),
        max(extends),
        0.25,
        0.0,
        False,
        0,
        None,
        None,
        tree_mask,
        True,
    )
    return out


def case_extend_attention_is_causal_over_the_extend_and_sees_the_prefix() -> None:
    k_cache, v_cache = _cache(64)
    table = torch.arange(64, dtype=I32).reshape(2, 32)
    q = torch.randn(3 + 20, 4, 16)  # request 0: 3 new of 7; request 1: 20 new of 30 (batched)
    out = _extend(q, k_cache, v_cache, table, [7, 30], [3, 20], [0, 3], None)
    for start, (first, length, n) in zip([0, 3], [(0, 7, 3), (32, 30, 20)], strict=True):
        seen = torch.ones(n, length, dtype=torch.bool)
        seen[:, length - n :] = torch.ones(n, n, dtype=torch.bool).tril()
        ks, vs = k_cache[first : first + length], v_cache[first : first + length]
        expected = _reference(q[start : start + n], ks, vs, seen)
        torch.testing.assert_close(out[start : start + n], expected, rtol=1e-5, atol=1e-5)


def case_extend_attention_under_a_tree_mask_gives_each_draft_its_path() -> None:
    k_cache, v_cache = _cache(16)
    table = torch.arange(16, dtype=I32).reshape(1, 16)
    q = torch.randn(4, 4, 16)
    out = _extend(q, k_cache, v_cache, table, [9], [4], [0], TREE_MASK)
    seen = torch.ones(4, 9, dtype=torch.bool)
    seen[:, 5:] = TREE_MASK.view(4, 4)
    torch.testing.assert_close(
        out, _reference(q, k_cache[:9], v_cache[:9], seen), rtol=1e-5, atol=1e-5
    )


def case_a_verify_steps_attention_is_bit_for_bit_the_decode_steps() -> None:
    """Greedy speculation gives the plain server's tokens only if a verified token's
    attention is computed exactly as a plain decode step's: same keys, same operations."""
    k_cache, v_cache = _cache(16)
    k_cache, v_cache = k_cache.bfloat16(), v_cache.bfloat16()
    table = torch.arange(16, dtype=I32).reshape(1, 16)
    q = torch.randn(4, 4, 16).bfloat16()
    verified = _extend(q, k_cache, v_cache, table, [10], [4], [0], None)
    for j in range(4):
        step = _decode(
            q[j : j + 1],
            k_cache,
            v_cache,
            None,
            None,
            torch.tensor([6 + j]),
            table,
            torch.tensor([0]),
            torch.tensor([7 + j]),
        )
        assert torch.equal(verified[j].float(), step[0].float()), j


def case_sglang_sees_the_attention_ops_and_no_weight_packing() -> None:
    """``convert_weight_packed`` absent is what keeps SGLang's layers on PyTorch's paths."""
    assert hasattr(torch.ops.sgl_kernel, "decode_attention_cpu")
    assert hasattr(torch.ops.sgl_kernel, "extend_attention_cpu")
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
    from sgl_kernel import rmsnorm
    from sgl_kernel.speculative import reconstruct_indices_from_tree_mask  # type: ignore[import-not-found]

    assert reconstruct_indices_from_tree_mask is sgl_kernel.reconstruct_indices_from_tree_mask
    try:
        rmsnorm(torch.ones(1))
    except NotImplementedError as exc:
        said = str(exc)
    else:
        raise AssertionError("an op the stand-in lacks ran")
    assert "sgl_kernel.rmsnorm" in said


def cases() -> dict[str, Callable[[], None]]:
    return {name: f for name, f in globals().items() if name.startswith("case_") and callable(f)}


def main() -> None:
    outcomes = {}
    for name, case in cases().items():
        try:
            case()
            outcomes[name] = "ok"
        except Exception:
            outcomes[name] = traceback.format_exc()
    print(json.dumps(outcomes))
    sys.exit(0)


if __name__ == "__main__":
    main()
