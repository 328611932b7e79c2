"""Open MPI's tuned collectives with their fixed decision rules (ompi/mca/coll/tuned/coll_tuned_decision_fixed.c,
the rules of Open MPI 1.x–3.x, still the defaults when no rules file is given to older releases).

All-reduce: recursive doubling below 10,000 bytes, else ring (segmented in 1 MB pieces past p MB, which
moves the same bytes). All-gather: recursive doubling (Bruck when p is not a power of two: the same
steps in arcsim's dissemination form) below 50,000 bytes of output, else ring (neighbour exchange for an
even p, which moves the same bytes in half the steps: priced as ring). Broadcast: binomial below 2,048
bytes; a split binary tree below 370,728 bytes (priced as binomial, which arcsim has); above, a pipeline
(chain) with 128 KiB segments while p < 1.6134e-6·S + 2.11, else 8–64 KiB segments by the same rule.
All-to-all: pairwise exchange (the rules' choice for large blocks; Bruck's for small ones is not priced apart).
"""

from __future__ import annotations

from arcsim.collectives.libraries.base import BARE, Choice, Library, Protocol
from arcsim.topology import Topology

OFFERED = {"allreduce": ("rd", "ring", "rhd", "binomial"), "allgather": ("rd", "ring"),
           "reducescatter": ("ring",), "broadcast": ("binomial", "chain"), "alltoall": ("pairwise",)}


def _default(op: str, nbytes: float, p: int) -> tuple[str, float]:
    """(algorithm, pipeline segment bytes or 0) by the fixed rules."""
    if op == "allreduce":
        return ("rd" if nbytes < 10_000 else "ring"), 0.0
    if op == "allgather":
        return ("rd" if nbytes < 50_000 else "ring"), 0.0
    if op == "broadcast":
        if nbytes < 370_728:
            return "binomial", 0.0
        for a, b, segment in ((1.6134e-6, 2.1102, 128), (None, 13, 8), (2.3679e-6, 1.1787, 64),
                              (3.2118e-6, 8.7936, 16)):
            if p < (b if a is None else a * nbytes + b):
                return ("binomial" if a is None else "chain"), segment * 1024.0
        return "chain", 8 * 1024.0
    if op == "alltoall":
        return "pairwise", 0.0
    return "ring", 0.0


class Mpi(Library):
    name = "mpi"
    summary = "Open MPI tuned: recursive doubling then ring all-reduce, Bruck/ring all-gather, binomial/pipelined bcast"
    offered = OFFERED
    source = "open-mpi/ompi ompi/mca/coll/tuned/coll_tuned_decision_fixed.c (3.1)"

    def choices(self, op: str, algo: str | None, nbytes: float, topo: Topology) -> list[Choice]:
        rule, segment = _default(op, nbytes, topo.ranks)
        chosen = algo or rule
        if chosen != "chain":
            return [Choice(chosen, BARE)]
        proto = Protocol("", chunk_bytes=segment or 128 * 1024.0)
        return [Choice(chosen, proto, proto.chunks(nbytes))]
