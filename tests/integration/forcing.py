"""Forced DFlash proposals for tests: every accept length, independent of draft quality."""
from __future__ import annotations

from typing import Callable


def forced(reference: list[int], prompt_len: int, corrupt_at: int | None) -> Callable[[list[int], int, int], list[int]]:
    """Proposals = the known greedy continuation `reference` of a prompt of `prompt_len` tokens,
    with the proposal at index `corrupt_at` changed (to another id below 1000), so exactly
    `corrupt_at` proposals are accepted per step (all of them when None)."""

    def propose(context: list[int], last: int, n: int) -> list[int]:
        start = len(context) - prompt_len + 1  # index in `reference` of the token after `last`
        out = [reference[start + i] if start + i < len(reference) else 0 for i in range(n)]
        if corrupt_at is not None and corrupt_at < n:
            out[corrupt_at] = (out[corrupt_at] + 1) % 1000
        return out

    return propose
