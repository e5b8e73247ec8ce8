"""Routers: which replica a new request goes to.

* ``round-robin`` — replicas in turn;
* ``least-outstanding`` — the replica with the fewest requests not yet finished (running +
  waiting), ties to the lowest index (vLLM's and Vidur's "least outstanding requests").
"""

from __future__ import annotations

from ..errors import DraftsimError

__all__ = ["Router", "RoundRobin", "LeastOutstanding", "ROUTERS", "make_router"]


class Router:
    name = "router"

    def pick(self, replicas: list) -> int:  # pragma: no cover - abstract
        raise NotImplementedError


class RoundRobin(Router):
    name = "round-robin"

    def __init__(self):
        self._next = 0

    def pick(self, replicas):
        i = self._next % len(replicas)
        self._next += 1
        return i


class LeastOutstanding(Router):
    name = "least-outstanding"

    def pick(self, replicas):
        loads = [r.outstanding() for r in replicas]
        return loads.index(min(loads))


ROUTERS = {"round-robin": RoundRobin, "least-outstanding": LeastOutstanding}


def make_router(name: str) -> Router:
    if name not in ROUTERS:
        raise DraftsimError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
    return ROUTERS[name]()
