"""Admission of requests to session slots: N slots, a bounded FIFO queue, 429 when full.

A slot is one `lucebox.Session` (its own KV cache and recurrent state), created once at start
so memory is claimed up front and a slot never allocates per request. The engine serialises
compute across sessions itself; slots bound how many requests are admitted at once (each holds
a session) and the queue bounds how many wait.

Contracts (all methods run on the event loop thread, except `release_threadsafe`):

* `reserve()` either returns a `Ticket` at once or raises `QueueFullError` at once: it never
  waits, so a request learns "429" before anything is sent.
* ``await ticket.slot()`` waits (FIFO) for a free slot. Cancelling the wait (client gone)
  withdraws the ticket; a slot handed to a cancelled waiter goes to the next one.
* Every slot handed out is given back exactly once with `release` (or `release_threadsafe`
  from a generation thread, *after* the thread stopped using the session).
"""
from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from typing import Any, Generic, Sequence, TypeVar

__all__ = ["QueueFullError", "Scheduler", "Ticket", "Slot"]

S = TypeVar("S")


class QueueFullError(Exception):
    """All slots are busy and the queue is full."""

    def __init__(self, retry_after: int) -> None:
        super().__init__("the server is busy: all generation slots are in use and the queue is full; retry later")
        self.retry_after = retry_after


@dataclass
class Slot(Generic[S]):
    """One admitted place: an index and the session it owns."""

    index: int
    session: S


class Ticket(Generic[S]):
    """A reserved place in line; `await slot()` to get the slot."""

    def __init__(self, scheduler: "Scheduler[S]", slot: Slot[S] | None) -> None:
        self._scheduler = scheduler
        self._slot = slot
        self._future: asyncio.Future[Slot[S]] | None = None
        self._withdrawn = False

    async def slot(self) -> Slot[S]:
        if self._slot is not None:
            return self._slot
        assert self._future is not None
        try:
            self._slot = await self._future
        except asyncio.CancelledError:
            self._scheduler._withdraw(self)
            raise
        return self._slot

    def cancel(self) -> None:
        """Withdraw a ticket that will not be used (an error before generation started).
        A slot already assigned to it is released."""
        if self._slot is not None:
            slot, self._slot = self._slot, None
            self._scheduler.release(slot)
        else:
            self._scheduler._withdraw(self)


class Scheduler(Generic[S]):
    """Slots over `sessions` with a queue of at most `max_queue` waiting requests."""

    def __init__(self, sessions: Sequence[S], max_queue: int, retry_after: int = 1) -> None:
        if not sessions:
            raise ValueError("the scheduler needs at least one session slot")
        if max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        self.n_slots = len(sessions)
        self.max_queue = max_queue
        self.retry_after = retry_after
        self._free: collections.deque[Slot[S]] = collections.deque(Slot(i, s) for i, s in enumerate(sessions))
        self._waiters: collections.deque[Ticket[S]] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def active(self) -> int:
        """Slots handed out and not yet released."""
        return self.n_slots - len(self._free)

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return len(self._waiters)

    def reserve(self) -> Ticket[S]:
        """A ticket for the next free slot; raises QueueFullError when the queue is full."""
        self._loop = asyncio.get_running_loop()
        if self._free and not self._waiters:
            return Ticket(self, self._free.popleft())
        if len(self._waiters) >= self.max_queue:
            raise QueueFullError(self.retry_after)
        ticket: Ticket[S] = Ticket(self, None)
        ticket._future = self._loop.create_future()
        self._waiters.append(ticket)
        return ticket

    def release(self, slot: Slot[S]) -> None:
        """Give a slot back: to the first live waiter, else to the free list."""
        while self._waiters:
            ticket = self._waiters.popleft()
            fut = ticket._future
            if fut is not None and not fut.done():
                fut.set_result(slot)
                return
        self._free.append(slot)

    def release_threadsafe(self, slot: Slot[S]) -> None:
        """`release` from another thread (a generation worker)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            self._free.append(slot)
            return
        try:
            loop.call_soon_threadsafe(self.release, slot)
        except RuntimeError:  # the loop stopped meanwhile (shutdown)
            self._free.append(slot)

    def _withdraw(self, ticket: Ticket[Any]) -> None:
        if ticket._withdrawn:
            return
        ticket._withdrawn = True
        fut = ticket._future
        try:
            self._waiters.remove(ticket)
        except ValueError:
            pass
        if fut is not None and fut.done() and not fut.cancelled():
            # the slot was handed over just as the waiter gave up: pass it on
            self.release(fut.result())
        elif fut is not None and not fut.done():
            fut.cancel()
