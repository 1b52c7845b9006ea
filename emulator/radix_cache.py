"""SGLang's radix cache in miniature: prompts' tokens in a radix tree of bounded size.

A request's prefix found in the tree is not prefilled again. The tree holds at most
``capacity`` tokens; past that the least recently used leaves go first, as SGLang's
``RadixCache.evict`` does. It models the cache's effect on time and its counts, not its
memory: what a running request holds in the KV pool is counted by the engine apart.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

Tokens = Sequence[str]


class _Node:
    __slots__ = ("children", "key", "parent", "used")

    def __init__(self, key: tuple[str, ...], parent: _Node | None, used: int) -> None:
        self.key = key  # the tokens on the edge into this node
        self.parent = parent
        self.children: dict[str, _Node] = {}
        self.used = used  # when it was last matched or inserted, in the cache's own ticks


class RadixCache:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a radix cache holds at least one token, not {capacity}")
        self.capacity = capacity
        self.size = 0  # tokens in the tree
        self._root = _Node((), None, 0)
        self._ticks = itertools.count(1)

    def match(self, tokens: Tokens) -> int:
        """How many of ``tokens``' first tokens the tree holds; they count as just used."""
        tick = next(self._ticks)
        node, at = self._root, 0
        while at < len(tokens):
            child = node.children.get(tokens[at])
            if child is None:
                break
            same = _common(child.key, tokens, at)
            child.used = tick
            at += same
            if same < len(child.key):
                break
            node = child
        return at

    def insert(self, tokens: Tokens) -> None:
        """Add ``tokens`` (what is there already is kept and touched), then evict to fit."""
        tick = next(self._ticks)
        node, at = self._root, 0
        while at < len(tokens):
            child = node.children.get(tokens[at])
            if child is None:
                leaf = _Node(tuple(tokens[at:]), node, tick)
                node.children[tokens[at]] = leaf
                self.size += len(leaf.key)
                break
            same = _common(child.key, tokens, at)
            if same < len(child.key):
                child = self._split(child, same)
            child.used = tick
            at += same
            node = child
        self._evict(protect=node)

    def _split(self, child: _Node, at: int) -> _Node:
        """``child``'s edge cut after ``at`` tokens; returns the new upper node."""
        parent = child.parent
        assert parent is not None  # the root is never split
        upper = _Node(child.key[:at], parent, child.used)
        parent.children[upper.key[0]] = upper
        child.key, child.parent = child.key[at:], upper
        upper.children[child.key[0]] = child
        return upper

    def _evict(self, protect: _Node) -> None:
        """Least recently used leaves first, until the tree fits; never the path just
        inserted (a prompt longer than the whole cache is dropped at once instead)."""
        if self.size <= self.capacity:
            return
        kept = set()
        node: _Node | None = protect
        while node is not None:
            kept.add(id(node))
            node = node.parent
        leaves = [(n.used, id(n), n) for n in self._leaves() if id(n) not in kept]
        heapq.heapify(leaves)
        while self.size > self.capacity and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = self._remove(leaf)
            if parent is not self._root and not parent.children and id(parent) not in kept:
                heapq.heappush(leaves, (parent.used, id(parent), parent))
        if self.size > self.capacity:  # only the new prompt is left, and it is too long
            self.clear()

    def _remove(self, leaf: _Node) -> _Node:
        parent = leaf.parent
        assert parent is not None
        del parent.children[leaf.key[0]]
        self.size -= len(leaf.key)
        return parent

    def _leaves(self) -> list[_Node]:
        found, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                found.append(node)
        return found

    def clear(self) -> None:
        self._root.children.clear()
        self.size = 0


def _common(key: tuple[str, ...], tokens: Tokens, at: int) -> int:
    """How many of ``key``'s tokens equal those of ``tokens`` from ``at``."""
    n = min(len(key), len(tokens) - at)
    i = 0
    while i < n and key[i] == tokens[at + i]:
        i += 1
    return i
