"""The control session on a thread of its own.

A replica's event loop can be busy for seconds: ten thousand births after a broker restart,
a burst of heartbeats, a large snapshot. Run on that loop, the control session would renew the
replica's presence late, the other replicas would take it for hung and end its PostgreSQL
session, its partitions would move, the new owners would receive a burst of births of their
own... (measured: at 10,000 nodes three replicas on two cores kept ending each other's sessions).
On its own thread and loop the session ticks on time whatever the main loop does (the GIL
hands it a slice every few milliseconds), so leadership and partitions only move when a
replica is really gone.

The listener still runs on the main loop: every callback is posted there, and the copies of
``is_leader``, ``leader_epoch`` and ``owned`` that the rest of the replica reads are updated
there, just before the callback, so they never change under its feet. Those copies lag the
session by one hop of the loop; a write made meanwhile with an epoch that was just taken away
is refused by fencing, as any stale write is."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from central.ha.control import ControlListener, ReplicaControl, ReplicaInfo


class _Relay:
    """The listener the session thread calls: updates the main-loop copies, then the listener."""

    def __init__(self, owner: ControlThread, listener: ControlListener, loop: asyncio.AbstractEventLoop) -> None:
        self._owner = owner
        self._listener = listener
        self._loop = loop

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, *args)

    def leadership_gained(self, epoch: int) -> None:
        self._post(self._owner._gained_leadership, epoch, self._listener)

    def leadership_lost(self) -> None:
        self._post(self._owner._lost_leadership, self._listener)

    def partitions_gained(self, gained: dict[int, int]) -> None:
        self._post(self._owner._gained_partitions, dict(gained), self._listener)

    def partitions_released(self, released: set[int]) -> None:
        self._post(self._owner._released_partitions, set(released), self._listener)


class ControlThread:
    """``ReplicaControl`` on its own thread and loop; the same reading surface on the main loop."""

    def __init__(self, make: Callable[[ControlListener], ReplicaControl], listener: ControlListener) -> None:
        """``make(relay)``: the control session, built with the relay as its listener."""
        self._make = make
        self._listener = listener
        self._control: ReplicaControl | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.is_leader = False
        self.leader_epoch: int | None = None
        self.owned: dict[int, int] = {}

    async def start(self) -> None:
        """Start the thread and the session; returns after its first tick (as ``ReplicaControl.start``)."""
        main = asyncio.get_running_loop()
        ready: asyncio.Future[None] = main.create_future()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            main.call_soon_threadsafe(ready.set_result, None)
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="replica-control", daemon=True)
        self._thread.start()
        await ready  # the thread's loop runs
        self._control = self._make(_Relay(self, self._listener, main))
        try:
            await self._call(self._control.start())
        except BaseException:
            self._control = None  # it holds nothing: its start failed
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop the session (it hands back its locks), then the thread."""
        if self._control is not None:
            await self._call(self._control.stop())
        await asyncio.sleep(0)  # the relayed release callbacks run before we return
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)

    async def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    @property
    def connected(self) -> bool:
        """Whether the session's connection is up."""
        return self._control is not None and self._control.connected

    def replicas(self) -> list[ReplicaInfo]:
        """The live replicas as of the session's last tick."""
        return self._control.replicas() if self._control is not None else []

    def leader_id(self) -> str | None:
        """Who leads, as of the session's last tick."""
        return self._control.leader_id() if self._control is not None else None

    # ----------------------------------------------------------------- on the main loop

    def _gained_leadership(self, epoch: int, listener: ControlListener) -> None:
        self.is_leader, self.leader_epoch = True, epoch
        listener.leadership_gained(epoch)

    def _lost_leadership(self, listener: ControlListener) -> None:
        if not self.is_leader:
            return
        self.is_leader, self.leader_epoch = False, None
        listener.leadership_lost()

    def _gained_partitions(self, gained: dict[int, int], listener: ControlListener) -> None:
        self.owned.update(gained)
        listener.partitions_gained(gained)

    def _released_partitions(self, released: set[int], listener: ControlListener) -> None:
        for k in released:
            self.owned.pop(k, None)
        listener.partitions_released(released)
