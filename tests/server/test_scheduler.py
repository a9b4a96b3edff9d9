"""Slots and the bounded queue (pure asyncio, no model)."""
from __future__ import annotations

import asyncio

import pytest

from lucebox.server.scheduler import QueueFullError, Scheduler


def run(coro):
    return asyncio.run(coro)


def test_free_slots_then_queue_then_full():
    async def main():
        s = Scheduler(["a", "b"], max_queue=1)
        t1, t2 = s.reserve(), s.reserve()
        assert {(await t1.slot()).session, (await t2.slot()).session} == {"a", "b"}
        assert s.active == 2 and s.queued == 0
        t3 = s.reserve()
        assert s.queued == 1
        with pytest.raises(QueueFullError) as e:
            s.reserve()
        assert e.value.retry_after == 1
        waiter = asyncio.ensure_future(t3.slot())
        await asyncio.sleep(0)
        assert not waiter.done()
        s.release(await t1.slot())
        assert (await waiter).session == "a"
        assert s.active == 2 and s.queued == 0
    run(main())


def test_fifo_order():
    async def main():
        s = Scheduler(["only"], max_queue=5)
        first = await s.reserve().slot()
        tickets = [s.reserve() for _ in range(3)]
        order = []

        async def wait(i, t):
            slot = await t.slot()
            order.append(i)
            s.release(slot)

        tasks = [asyncio.ensure_future(wait(i, t)) for i, t in enumerate(tickets)]
        await asyncio.sleep(0)
        s.release(first)
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2]
        assert s.active == 0 and s.queued == 0
    run(main())


def test_cancelled_waiter_leaves_queue_and_slot_goes_to_next():
    async def main():
        s = Scheduler(["only"], max_queue=5)
        held = await s.reserve().slot()
        gone, stays = s.reserve(), s.reserve()
        t_gone = asyncio.ensure_future(gone.slot())
        t_stays = asyncio.ensure_future(stays.slot())
        await asyncio.sleep(0)
        t_gone.cancel()
        await asyncio.sleep(0)
        assert s.queued == 1
        s.release(held)
        assert (await t_stays).session == "only"
        s.release(await stays.slot())
        assert s.active == 0
    run(main())


def test_slot_handed_over_as_waiter_is_cancelled_is_not_lost_or_doubled():
    async def main():
        s = Scheduler(["only"], max_queue=5)
        held = await s.reserve().slot()
        ticket = s.reserve()
        task = asyncio.ensure_future(ticket.slot())
        await asyncio.sleep(0)
        s.release(held)          # the waiter's future now has the slot...
        task.cancel()            # ...but its task is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await task
        ticket.cancel()          # the caller's cleanup must not release a second time
        assert s.active == 0 and s.queued == 0
        assert len(s._free) == 1
    run(main())


def test_unused_ticket_cancel_returns_slot():
    async def main():
        s = Scheduler(["a"], max_queue=0)
        t = s.reserve()
        await t.slot()
        t.cancel()
        assert s.active == 0
        with pytest.raises(QueueFullError):
            s.reserve(), s.reserve()
    run(main())
