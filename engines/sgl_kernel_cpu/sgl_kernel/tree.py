"""The draft tree of a speculative step: how its nodes link (first child, next sibling),
where each sits (its position in the sequence), which nodes each may see, and the greedy
walk that accepts the longest path the target model agrees with.

Trees have a few nodes (the number of draft tokens), so the walks are plain Python over
lists; the NGRAM reconstruction, which sees the whole batch at once, is vectorised.
"""

from __future__ import annotations

import torch  # type: ignore[import-not-found]
from torch import Tensor

_FULL_MASK, _QLEN_ONLY = 0, 1  # SGLang's TreeMaskMode values that a CPU worker uses


def reconstruct_indices_from_tree_mask(
    tree_mask: Tensor,
    verified_seq_len: Tensor,
    positions: Tensor,
    retrieve_index: Tensor,
    retrieve_next_token: Tensor,
    retrieve_next_sibling: Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """NGRAM's drafts come as a visibility mask (``mask[b, i, j]``: node i sees node j);
    from it: each node's depth (its ancestors, j < i, that it sees), its parent (the nearest
    of them), its first child and its next sibling (the next node with the same parent)."""
    n = draft_token_num
    mask = tree_mask[: batch_size * n * n].view(batch_size, n, n).bool()
    below = torch.ones(n, n, dtype=torch.bool).tril(-1)
    ancestors = mask & below  # [b, node, ancestor]
    order = torch.arange(n)
    none = torch.full((), n)
    depth = ancestors.sum(-1)
    parent = torch.where(ancestors, order, -1).amax(-1)  # [b, node]
    child = torch.where(ancestors.transpose(1, 2), order, none).amin(-1)
    later = order[None, :] > order[:, None]  # [node, other]: other comes after node
    same_parent = (parent[:, :, None] == parent[:, None, :]) & later & (parent[:, :, None] >= 0)
    sibling = torch.where(same_parent, order, none).amin(-1)
    flat = slice(0, batch_size * n)
    positions.view(-1)[flat] = (depth + verified_seq_len[:batch_size, None]).reshape(-1)
    retrieve_index.view(-1)[flat] = torch.arange(batch_size * n)
    retrieve_next_token.view(-1)[flat] = torch.where(child == n, -1, child).reshape(-1)
    retrieve_next_sibling.view(-1)[flat] = torch.where(sibling == n, -1, sibling).reshape(-1)


def verify_tree_greedy_cpu(
    predicts: Tensor,
    accept_index: Tensor,
    accept_token_num: Tensor,
    candidates: Tensor,
    retrive_index: Tensor,
    retrive_next_token: Tensor,
    retrive_next_sibling: Tensor,
    target_predict: Tensor,
) -> None:
    """From the root, step to the first child whose draft token is what the target model
    predicted after the node accepted last (trying siblings in turn), until none matches or
    ``accept_index``'s width is reached. ``predicts`` gets, at each accepted node's flat
    index, the target's token after it; ``accept_token_num`` the drafts accepted (the bonus
    token, predicted after the last accepted node, not counted)."""
    steps = accept_index.shape[1]
    target = target_predict.reshape(-1).tolist()
    for b in range(candidates.shape[0]):
        tokens, index = candidates[b].tolist(), retrive_index[b].tolist()
        child, sibling = retrive_next_token[b].tolist(), retrive_next_sibling[b].tolist()
        last = index[0]
        accept_index[b, 0] = last
        accepted, node = 0, 0
        for _ in range(1, steps):
            node = child[node]
            while node != -1 and tokens[node] != target[last]:
                node = sibling[node]
            if node == -1:
                break
            predicts.view(-1)[last] = target[last]
            accepted += 1
            accept_index[b, accepted] = index[node]
            last = index[node]
        accept_token_num[b] = accepted
        predicts.view(-1)[last] = target[last]


def fill_bonus_tokens_cpu(
    accept_tokens: Tensor, accept_lens: Tensor, bonus_tokens: Tensor, accept_stride: int
) -> None:
    """Each request's last accepted token (the bonus token counted), row-major rows of
    ``accept_stride``."""
    rows = torch.arange(accept_lens.numel()) * accept_stride
    bonus_tokens.copy_(accept_tokens.reshape(-1)[rows + accept_lens.to(torch.int64) - 1])


def _parents(parents: list[int], chosen: list[int], topk: int) -> list[int]:
    """Each node's parent node: node i > 0 is draft ``chosen[i - 1]``, whose parent is draft
    ``parents[chosen[i - 1] // topk]``, or the root (node 0) when that quotient is 0; -1
    for the root, and for a node whose parent draft is not among the nodes."""
    node_of = {draft: i + 1 for i, draft in enumerate(chosen)}
    found = [-1]
    for draft in chosen:
        slot = draft // topk
        found.append(0 if slot == 0 else node_of.get(parents[slot], -1))
    return found


def build_tree_kernel_efficient_cpu(
    parent_list: Tensor,
    selected_index: Tensor,
    verified_seq_len: Tensor,
    tree_mask: Tensor,
    positions: Tensor,
    retrive_index: Tensor,
    retrive_next_token: Tensor,
    retrive_next_sibling: Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """EAGLE's tree from its top-k expansion (see ``_parents``). Links are made from the
    last node back, so a parent's first child is its earliest. A node sees the root, its
    ancestors and itself; the full mask also has the committed tokens' columns, which it
    leaves as they are."""
    if tree_mask_mode not in (_FULL_MASK, _QLEN_ONLY):
        raise ValueError(f"tree mask mode {tree_mask_mode}: only full or qlen-only on a CPU")
    n = draft_token_num
    mask_start = 0
    for b, length in enumerate(verified_seq_len.tolist()):
        up = _parents(parent_list[b].tolist(), selected_index[b].tolist()[: n - 1], topk)
        child, sibling = [-1] * n, [-1] * n
        for i in range(n - 1, 0, -1):
            if up[i] != -1:
                sibling[i], child[up[i]] = child[up[i]], i
        off = b * n
        retrive_index[b] = torch.arange(off, off + n)
        retrive_next_token[b] = torch.tensor(child)
        retrive_next_sibling[b] = torch.tensor(sibling)
        width = n if tree_mask_mode == _QLEN_ONLY else length + n
        first = off * n if tree_mask_mode == _QLEN_ONLY else mask_start + length
        for node in range(n):
            path = [0]
            at = node
            while at > 0:
                path.append(at)
                at = up[at]
            row = first + node * width
            tree_mask[row : row + n] = False
            tree_mask[torch.tensor(path) + row] = True
            positions.view(-1)[off + node] = length + len(path) - 1
        mask_start += n * (length + n)
