#!/usr/bin/env python3
"""A model of one warp's chunk pipeline in cpp/kernels/q8_0_matmul.cuh (no GPU needed).

Replays the kernel's order of weight and activation copies, cp.async commit groups and waits for
ST stages and WA weights-ahead buffers (weights_ahead) and checks, for every chunk:
its weights and activations are complete in their buffers when it is multiplied; no copy lands in
a buffer whose chunk is not yet consumed; the tile's partial sums go where no copy is pending; and,
with WA > 0, that the weights WA chunks ahead are still in flight (the wait does not cover them).
The model is written from the kernel by hand: change both together.
    python3 bench/probes/pipeline_schedule.py
"""
import itertools


def check(stages: int, ahead: int, n_chunks: int, tile_chunks: int) -> None:
    groups: list[list[tuple[str, int, int]]] = []  # committed groups, completing in order
    pending: list[tuple[str, int, int]] = []       # copies issued since the last commit
    done = 0                                       # groups[:done] are complete
    complete: set[tuple[str, int]] = set()
    w_slot: dict[int, int] = {}                    # buffer -> chunk last copied into it
    x_slot: dict[int, int] = {}
    w_buffers = stages + ahead

    def commit() -> None:
        groups.append(list(pending))
        pending.clear()

    def issue_weights(chunk: int, current: int) -> None:
        if chunk >= n_chunks:
            return
        b = chunk % w_buffers
        assert w_slot.get(b, -1) < current, f"weights of {chunk} over unconsumed {w_slot[b]}"
        w_slot[b] = chunk
        pending.append(("w", chunk, b))

    def issue_x(chunk: int, current: int) -> None:  # commits, like the kernel's issue_x
        if chunk < n_chunks:
            b = chunk % stages
            assert x_slot.get(b, -1) < current, f"activations of {chunk} over unconsumed {x_slot[b]}"
            x_slot[b] = chunk
            pending.append(("x", chunk, b))
        commit()

    def wait(newest_allowed_pending: int) -> None:
        nonlocal done
        done = max(done, len(groups) - newest_allowed_pending)
        for g in groups[:done]:
            complete.update((kind, c) for kind, c, _ in g)

    # prologue: weights (before the wait for the previous kernel), then activations
    for i in range(stages - 1 + ahead):
        issue_weights(i, 0)
    for i in range(stages - 1):
        issue_x(i, 0)
        if ahead > 0:
            commit()
    for i in range(n_chunks):
        wait(2 * stages - 3 if ahead > 0 else stages - 2)
        j = i + stages - 1  # (after __syncwarp: chunk i - 1 is consumed)
        if ahead == 0:
            issue_weights(j, i)
            issue_x(j, i)
        else:
            issue_x(j, i)
            issue_weights(j + ahead, i)
            commit()
        assert ("w", i) in complete and ("x", i) in complete, f"chunk {i} multiplied before it landed"
        assert w_slot[i % w_buffers] == i and x_slot[i % stages] == i
        if ahead > 0 and i >= stages + ahead and i + ahead < n_chunks:
            assert ("w", i + ahead) not in complete, f"the wait at chunk {i} covers the weights ahead"
        if (i + 1) % tile_chunks == 0:  # tile end: partial sums into stage i % stages
            in_flight = [c for g in groups[done:] for c in g] + pending
            # (ahead > 0: the stage's activation part; else the whole stage)
            assert not any(b == i % stages and (ahead == 0 or kind == "x") for kind, _, b in in_flight), \
                f"partial sums of the tile ending at chunk {i} over a pending copy"


def main() -> None:
    cases = 0
    for stages, ahead, n_chunks, tile_chunks in itertools.product(range(2, 5), range(0, 3), range(1, 40),
                                                                  (1, 2, 3, 5, 17)):
        if n_chunks % tile_chunks == 0:
            check(stages, ahead, n_chunks, tile_chunks)
            cases += 1
    print(f"pipeline schedule: {cases} cases (stages 2..4, weights ahead 0..2, 1..39 chunks) hold")


if __name__ == "__main__":
    main()
