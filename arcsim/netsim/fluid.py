"""Links as fluid resources inside a SimPy environment.

A flow crosses a path of resources; while n flows share a resource each gets 1/n of its bandwidth,
and a flow moves at the rate of its most crowded resource. Rates are recomputed only for the flows
that share a resource with one that starts or ends, so uncontended flows cost one event each.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from typing import Any

import simpy


class _Flow:
    __slots__ = ("done", "last", "path", "rate", "remaining", "token")

    def __init__(self, path: Sequence[Hashable], nbytes: float, done: simpy.Event, now: float) -> None:
        self.path = path
        self.remaining = nbytes
        self.done = done
        self.rate = 0.0
        self.last = now
        self.token = 0


class FluidNetwork:
    def __init__(self, env: simpy.Environment, capacity: Callable[[Any], float]) -> None:
        self.env = env
        self._capacity = capacity
        self._bandwidth: dict[Hashable, float] = {}
        self._users: dict[Hashable, set[_Flow]] = defaultdict(set)

    def send(self, path: Sequence[Hashable], nbytes: float, done: simpy.Event | None = None) -> simpy.Event:
        """An event that fires when ``nbytes`` have crossed ``path``: ``done`` when given (one event fewer
        than chaining a new one to it), else a new one."""
        done = self.env.event() if done is None else done
        if nbytes <= 0:
            done.succeed()
            return done
        flow = _Flow(path, nbytes, done, self.env.now)
        affected = {flow}
        for key in path:
            if key not in self._bandwidth:
                self._bandwidth[key] = self._capacity(key)
            users = self._users[key]
            affected |= users
            users.add(flow)
        self._rebalance(affected)
        return done

    def _rebalance(self, flows: set[_Flow]) -> None:
        now, bandwidth, users = self.env.now, self._bandwidth, self._users
        for f in flows:
            f.remaining -= f.rate * (now - f.last)
            f.last = now
            rate = float("inf")
            for key in f.path:  # the most crowded resource sets the pace (a loop: this is the hot path)
                rate = min(rate, bandwidth[key] / len(users[key]))
            f.rate = rate
            f.token += 1
            wake = self.env.timeout(max(f.remaining, 0.0) / rate)
            wake.callbacks.append(partial(self._finish, f, f.token))

    def _finish(self, flow: _Flow, token: int, _: simpy.Event) -> None:
        if token != flow.token:
            return  # the flow's rate changed since this wake-up was set
        affected: set[_Flow] = set()
        for key in flow.path:
            users = self._users[key]
            users.discard(flow)
            affected |= users
        flow.done.succeed()
        if affected:
            self._rebalance(affected)
