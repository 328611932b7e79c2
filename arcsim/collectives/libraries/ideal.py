"""No library: every algorithm arcsim describes, on the bare links, the cheapest by the closed form."""

from __future__ import annotations

from arcsim.collectives.libraries.base import BARE, Choice, Library
from arcsim.topology import Topology


class Ideal(Library):
    name = "ideal"
    summary = "every algorithm on the bare links; the cheapest by the closed form (no library implements this)"
    source = "Thakur, Rabenseifner & Gropp (2005); the textbook α–β(–γ) costs"

    def algorithms(self, op: str) -> tuple[str, ...]:
        from arcsim.collectives import ALGORITHMS  # the catalogue imports this package: read it when asked

        return tuple(ALGORITHMS[op])

    def choices(self, op: str, algo: str | None, nbytes: float, topo: Topology) -> list[Choice]:
        return [Choice(a, BARE) for a in (self.algorithms(op) if algo is None else (algo,))]
