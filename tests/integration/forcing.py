"""Forced DFlash proposals (chains and trees) for tests: every accept length, independent of draft quality."""
from __future__ import annotations

from typing import Callable

import numpy as np


def forced(reference: list[int], prompt_len: int,
           corrupt_at: int | None) -> Callable[[np.ndarray, int, int], list[int]]:
    """Proposals = the known greedy continuation `reference` of a prompt of `prompt_len` tokens,
    with the proposal at index `corrupt_at` changed (to another id below 1000), so exactly
    `corrupt_at` proposals are accepted per step (all of them when None)."""

    def propose(context: np.ndarray, last: int, n: int) -> list[int]:
        start = len(context) - prompt_len + 1  # index in `reference` of the token after `last`
        out = [reference[start + i] if start + i < len(reference) else 0 for i in range(n)]
        if corrupt_at is not None and corrupt_at < n:
            out[corrupt_at] = (out[corrupt_at] + 1) % 1000
        return out

    return propose


def forced_tree(reference: list[int], prompt_len: int, accept: int
                ) -> Callable[[np.ndarray, int, int], tuple[list[int], list[int]]]:
    """A tree whose right path (the known greedy continuation) is `accept` deep and is never the
    first child: at each depth the on-path node gets a wrong first child (the spine), then a decoy
    (the right token under the previous depth's wrong node), then the right child. Nodes are in
    breadth-first order, so a right node's parent is never the row before it."""

    def propose(context: np.ndarray, last: int, max_nodes: int) -> tuple[list[int], list[int]]:
        start = len(context) - prompt_len + 1  # index in `reference` of the token after `last`

        def nxt(i: int) -> int:
            return reference[start + i] if start + i < len(reference) else 0

        tokens: list[int] = []
        parents: list[int] = []
        right, wrong = 0, -1  # node indices in the full tree (0 = the root)
        for depth in range(max_nodes):
            if len(tokens) + 3 > max_nodes:
                break
            good = nxt(depth)
            tokens.append((good + 1) % 1000)  # wrong first child: the top-1 spine
            parents.append(right)
            new_wrong = len(tokens)
            if wrong >= 0:
                tokens.append(good)  # decoy: the right token under a rejected node
                parents.append(wrong)
            wrong = new_wrong
            if depth >= accept:
                break
            tokens.append(good)
            parents.append(right)
            right = len(tokens)
        return tokens, parents

    return propose
