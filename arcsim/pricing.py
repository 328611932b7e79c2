"""Price collectives on a topology as its library runs them: one path for `arcsim collective`, `run`, `sweep`
and `train` (a calibrated op by its measured fit; otherwise the library's algorithm and protocol on either
engine), reporting nccl-tests figures."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from arcsim.collectives import (
    ALGORITHM_NAMES,
    PIPELINED,
    Schedule,
    build,
    busbw_factor,
    limits,
    message_count,
    normalize_op,
)
from arcsim.collectives.libraries import LIBRARIES, Choice, get_library
from arcsim.collectives.limits import TooMuchWork, lifted
from arcsim.comm.log import GROUPS, CommRecord, on_ranks
from arcsim.errors import CollectiveError
from arcsim.netsim import ENGINES, des, estimate
from arcsim.topology import Topology

# the catalogue's algorithms, those a library runs on other steps (NCCL's NVLS), and the library's own choice or all
PRICES_PREFIX = "prices-"  # kept price tables' names in arcsim.files' cache (one per topology and engine)
PRICES_VERSION = 1  # with arcsim's code digest in the name: kept prices are never of other code

ALGO_CHOICES = (*dict.fromkeys([*ALGORITHM_NAMES, *(a for lib in LIBRARIES.values() for algos in
                                                   getattr(lib, "offered", {}).values() for a in algos)]),
                "auto", "all")


@dataclass(frozen=True)
class CollectiveResult:
    topology: str
    op: str
    algo: str
    engine: str
    ranks: int
    bytes: float
    time_s: float
    algbw_Bps: float
    busbw_Bps: float
    auto: bool  # chosen by the library (algorithm 'auto')
    steps: int
    messages: int
    detail: str
    events: int  # DES: SimPy events processed (0 for analytic)
    simulated_ranks: int  # DES: rank processes simulated (fewer than ranks when symmetry applies)
    library: str = "ideal"
    protocol: str = ""  # the library's protocol for this run (NCCL: LL, LL128, Simple; gloo: tcp)

    def to_dict(self) -> dict:
        return asdict(self)


def algorithms_for(topo: Topology, op: str) -> tuple[str, ...]:
    """The algorithms the topology's library offers for ``op``."""
    return get_library(topo.library).available(normalize_op(op), topo)


@dataclass(frozen=True)
class Plan:
    """How the topology's library runs one collective, and what the closed form prices it at."""

    choice: Choice
    schedule: Schedule  # built on the links as the choice's protocol sees them
    analytic_s: float   # the protocol's fixed cost + the closed form of the schedule

    @property
    def algo(self) -> str:
        return self.choice.algo


def plans(topo: Topology, op: str, algo: str, nbytes: float, chunks: int | None = None) -> list[Plan]:
    """Every way the library may run ``op`` of ``nbytes`` (algorithm ``auto``: each it would choose between; else that
    one, in each of its protocols), priced by the closed form, among those within the work limits of
    arcsim.collectives.limits."""
    op = normalize_op(op)
    choices = _choices(topo, op, algo, nbytes, chunks)
    found, refused = [], []
    built: dict[tuple[str, int | None], Schedule] = {}  # protocols share a schedule unless it prices its chunks
    for c in choices:
        links = c.protocol.links(topo)
        shareable = c.chunks is not None or (op, c.steps) not in PIPELINED
        try:
            schedule = built.get((c.steps, c.chunks)) if shareable else None
            if schedule is None:
                schedule = build(c.runs_as or op, c.steps, nbytes, links, c.chunks)
                if shareable:
                    built[(c.steps, c.chunks)] = schedule
            found.append(Plan(c, schedule, c.protocol.time_s(estimate(schedule, links, "analytic").time_s, nbytes)))
        except TooMuchWork as exc:
            refused.append(str(exc))
    if not found:
        raise TooMuchWork("; ".join(dict.fromkeys(refused)))  # protocols refused for one reason: say it once
    return found


def _choices(topo: Topology, op: str, algo: str, nbytes: float, chunks: int | None) -> list[Choice]:
    """The ways the topology's library may run ``op`` (a normalised name) of ``nbytes``, in ``chunks`` pieces if set."""
    lib = get_library(topo.library)
    offered = lib.algorithms(op)
    if algo != "auto" and algo not in offered:
        would = plan(topo, op, "auto", nbytes).algo
        raise CollectiveError(f"{lib.name} has no {algo} {op} (it offers {', '.join(offered)}; for {nbytes:.0f} bytes "
                              f"it would use {would}); pick one of those or another --library")
    choices = lib.choices(op, None if algo == "auto" else algo, nbytes, topo)
    return choices if chunks is None else [dataclasses.replace(c, chunks=chunks) for c in choices]


def refuse_unsimulable(topo: Topology, op: str, algo: str, nbytes: float, chunks: int | None = None,
                       start_times: np.ndarray | None = None) -> None:
    """Refuse before building any schedule to simulate when the DES could run none of the library's ways of ``op``
    within its event limit (arcsim.collectives.limits), where their messages are counted without building
    (message_count; docs/collectives.md has the time it saves). Ways too large to store are left to plan(), which
    refuses them for that. Symmetries, which only lower the estimate, are read only where the messages alone pass the
    limit: from the algorithm built in one chunk, once (protocols change its links' speeds, not their shape)."""
    if lifted():
        return
    op = normalize_op(op)
    least, folded = float("inf"), {}
    for c in _choices(topo, op, algo, nbytes, chunks):
        links = c.protocol.links(topo)
        try:
            messages = message_count(c.runs_as or op, c.steps, nbytes, links, c.chunks)
        except TooMuchWork:  # too large to build: plan() refuses it as such, or runs another way
            continue
        if messages is None or limits.within_des(limits.des_events(messages)):
            return  # this way may be simulated
        if c.steps not in folded:
            like = build(c.runs_as or op, c.steps, nbytes, links, 1)
            folded[c.steps] = (like, des.simulated_ranks(like, links, start_times))
        least = min(least, des.expected_events(*folded[c.steps], messages))
        what = f"{c.steps} {op} on {topo.ranks:,} ranks"
    if least < float("inf"):
        limits.check_des(what, least)


def plan(topo: Topology, op: str, algo: str, nbytes: float, chunks: int | None = None) -> Plan:
    """The library's way to run ``op`` of ``nbytes`` (algorithm ``auto``: its own rule or its cheapest by the closed
    form): the cheapest of :func:`plans`."""
    return min(plans(topo, op, algo, nbytes, chunks), key=lambda p: p.analytic_s)


def start_times(topo: Topology, compute_s: float) -> np.ndarray:
    """Arrival time of each rank when each first computes for ``compute_s`` × its straggler slowdown."""
    return np.array([compute_s * topo.slowdown(r) for r in range(topo.ranks)])


def price_collective(topo: Topology, op: str, algo: str, nbytes: float, engines: tuple[str, ...],
                     compute_s: float = 0.0, seed: int = 0,
                     progress: Callable[[str, float, float], None] | None = None,
                     chunks: int | None = None) -> list[CollectiveResult]:
    """Every (algorithm, engine) asked for, as the topology's library runs it (a calibrated op by its fit);
    ``progress(algorithm, fraction, events)`` follows long DES runs."""
    op = normalize_op(op)
    for engine in engines:
        if engine not in ENGINES:
            raise CollectiveError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)} or both")
    factor = busbw_factor(op, topo.ranks)

    def result(algo_name: str, engine: str, time_s: float, steps: int = 0, messages: int = 0, detail: str = "",
               events: int = 0, simulated_ranks: int = 0, protocol: str = "") -> CollectiveResult:
        algbw = nbytes / time_s if time_s > 0 else float("inf")
        return CollectiveResult(topology=topo.name, op=op, algo=algo_name, engine=engine, ranks=topo.ranks,
                                bytes=float(nbytes), time_s=time_s, algbw_Bps=algbw, busbw_Bps=algbw * factor,
                                auto=algo == "auto", steps=steps, messages=messages, detail=detail, events=events,
                                simulated_ranks=simulated_ranks, library=topo.library, protocol=protocol)

    fit = topo.calibration.get(op)
    if fit is not None:  # measured: one line, whatever the algorithm or engine
        return [result("measured", engine, fit.time(nbytes), detail=f"fit measured at {fit.ranks} ranks")
                for engine in engines]
    names = algorithms_for(topo, op) if algo == "all" else (algo,)
    arrivals = start_times(topo, compute_s) if compute_s > 0 else None
    if "des" in engines:  # every algorithm before any is priced: none simulated only to refuse the next
        for name in names:
            refuse_unsimulable(topo, op, name, nbytes, chunks, arrivals)
    results = []
    for name in names:
        chosen = plan(topo, op, name, nbytes, chunks)
        protocol, schedule = chosen.choice.protocol, chosen.schedule
        for engine in engines:
            if engine == "analytic" and arrivals is None:  # what plan() priced already
                time_s, events, simulated = chosen.analytic_s, 0, 0
            else:
                follow = None if progress is None else (lambda done, events, a=chosen.algo: progress(a, done, events))
                est = estimate(schedule, protocol.links(topo), engine, start_times=arrivals, seed=seed, progress=follow)
                waited = 0.0 if arrivals is None else float(arrivals.max() - arrivals.min())  # from the first arrival
                time_s, events = protocol.time_s(est.time_s, nbytes, waited), est.events
                simulated = est.simulated_ranks
            results.append(result(chosen.algo, engine, time_s, steps=schedule.step_count,
                                  messages=schedule.message_count, detail=schedule.detail, events=events,
                                  simulated_ranks=simulated, protocol=protocol.name))
    return results


@dataclass(frozen=True)
class PricedRecord:
    op: str
    tag: str
    algo: str
    bytes: float  # the collective's size in nccl-tests terms (all-gather: total output on this topology)
    time_s: float
    protocol: str = ""


def group_topology(topo: Topology, group: str) -> Topology:
    """The links a group of ``topo``'s ranks uses, as a topology of its own (priced as its library runs it):
    ``world`` is ``topo``; ``node`` the GPUs of one node on the intra-node links; ``inter`` one rank per node —
    one of the node's G rails, which run at once and share the node's NICs, so each has nics / G of them (one
    NIC each on a rail-aligned node). A group's measured fits (``group_calibration``, measured in that group)
    replace its step model; the world's fits are not the group's (other ranks, other links)."""
    if group == "world":
        return topo
    g, fits = topo.gpus_per_node, dict(topo.group_calibration.get(group, {}))
    if group == "node":
        return dataclasses.replace(topo, name=f"{topo.name}: one node", nodes=1, calibration=fits,
                                   group_calibration={}, stragglers={r: s for r, s in topo.stragglers.items() if r < g})
    if group == "inter":
        net = topo.network
        share = net.bandwidth_per_nic * net.nics_per_node / g
        rail = dataclasses.replace(net, nics_per_node=1, bandwidth_per_nic=share,
                                   nic_share=net.nic_share * min(1.0, net.nics_per_node / g))
        return dataclasses.replace(topo, name=f"{topo.name}: one rail", gpus_per_node=1, network=rail,
                                   calibration=fits, group_calibration={},
                                   stragglers={r // g: s for r, s in topo.stragglers.items() if r % g == 0})
    raise CollectiveError(f"unknown group {group!r}; choose one of {', '.join(GROUPS)}")


class Pricer:
    """Prices collectives by (op, algorithm, bytes per rank) on one topology and engine, with a cache; a
    record of a group (arcsim.comm.log.GROUPS) on that group's links (:func:`group_topology`).

    The same path as :func:`price_collective`: ops the topology has measured (``calibration``, from arcsim
    calibrate) by their fitted line, reported with the algorithm "measured"; the others as its library runs them.
    """

    def __init__(self, topo: Topology, engine: str = "analytic") -> None:
        self.topo, self.engine = topo, engine
        self._cache = _shared_cache(topo, engine)
        self._groups: dict[str, Pricer] = {}

    def group(self, name: str) -> Pricer:
        """The pricer of one group's links."""
        if name == "world":
            return self
        if name not in self._groups:
            self._groups[name] = Pricer(group_topology(self.topo, name), self.engine)
        return self._groups[name]

    def price(self, op: str, bytes_per_rank: float, algo: str = "auto", tag: str = "") -> PricedRecord:
        """The collective's size is per rank; an all-gather's total output is that × the topology's ranks."""
        free = lifted()  # a price allowed past the work limits is not an answer where they hold
        key = (op, algo, bytes_per_rank, tag, free)
        hit = self._cache.get(key)
        if hit is None:
            as_priced = (op, algo, bytes_per_rank, "", free)
            untagged = self._cache.get(as_priced)
            if untagged is None:
                untagged = self._cache[as_priced] = self._price(op, algo, bytes_per_rank)
            hit = self._cache[key] = dataclasses.replace(untagged, tag=tag)  # frozen: shared by every caller
        return hit

    def _price(self, op: str, algo: str, bytes_per_rank: float) -> PricedRecord:
        nbytes = bytes_per_rank * (self.topo.ranks if op == "allgather" else 1)
        res = price_collective(self.topo, op, algo, nbytes, (self.engine,))[0]
        return PricedRecord(op, "", res.algo, nbytes, res.time_s, res.protocol)

    def records(self, records: list[CommRecord], algorithms: dict[str, str] | None = None) -> list[PricedRecord]:
        """Each record on its group's links; ``algorithms`` (op → algorithm) applies to the data's collectives —
        every rank's, or the rails' between nodes — while the dense steps inside a node are the library's. A share of
        the tensor per rank (1-bit Adam's server chunks) is resized to the group's ranks first (``on_ranks``)."""
        chosen = algorithms or {}
        out = []
        for r in records:
            group = self.group(r.group)
            r = on_ranks(r, group.topo.ranks)
            out.append(group.price(r.op, r.bytes_per_rank, "auto" if r.group == "node" else chosen.get(r.op, "auto"),
                                   r.tag))
        return out


PriceKey = tuple[str, str, float, str, bool]  # (op, algorithm asked, bytes per rank, tag, work limits lifted)
_PRICED: OrderedDict[tuple[str, str], dict[PriceKey, PricedRecord]] = OrderedDict()
PRICED_TOPOLOGIES = 512  # topologies whose prices are kept in memory (least recently used dropped first)
_KEPT: dict[tuple[str, str], int] = {}  # how many untagged prices of a topology the disk held when read (or written)
_KEEPER: list[int] = []  # the process that keeps prices on disk at its exit (not a forked child)


def _shared_cache(topo: Topology, engine: str) -> dict[PriceKey, PricedRecord]:
    """The prices of every Pricer of an equal topology on ``engine`` (equal: the same fields, as its repr shows
    them): a run re-prices the same clusters many times over (each bandwidth of the crossover and of the verdicts'
    tips, each group, each strategy), and pricing is a pure function of the topology, the collective and arcsim's
    code. Read from the disk the first time a process prices the topology (:func:`keep_prices` wrote them)."""
    key = (repr(topo), engine)
    cache = _PRICED.get(key)
    if cache is None:
        cache = _PRICED[key] = _read_prices(key)
        _KEPT[key] = len(cache)
        if len(_PRICED) > PRICED_TOPOLOGIES:
            _KEPT.pop(_PRICED.popitem(last=False)[0], None)
        if not _KEEPER:
            _KEEPER.append(os.getpid())
            atexit.register(keep_prices)
    else:
        _PRICED.move_to_end(key)
    return cache


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """A digest of arcsim's own source files: prices kept on disk are those of the code that priced them."""
    root = Path(__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _prices_name(key: tuple[str, str]) -> str:
    from importlib.metadata import PackageNotFoundError, version

    from arcsim import __version__
    from arcsim.files import cache_key

    try:  # the DES runs on SimPy: another SimPy, other events
        simpy = version("simpy") if key[1] == "des" else ""
    except PackageNotFoundError:
        simpy = "?"
    return PRICES_PREFIX + cache_key({"v": PRICES_VERSION, "code": code_version(), "arcsim": __version__,
                                      "simpy": simpy, "topology": key[0], "engine": key[1]})


def _read_prices(key: tuple[str, str]) -> dict[PriceKey, PricedRecord]:
    """The untagged prices kept on disk for (topology repr, engine); none where absent or damaged."""
    from arcsim.files import cache_read

    raw = cache_read(_prices_name(key))
    if not isinstance(raw, dict) or raw.get("topology") != key[0] or not isinstance(raw.get("prices"), list):
        return {}
    try:
        return {(op, asked, size, "", bool(free)): PricedRecord(op, "", algo, float(nbytes), float(time_s), protocol)
                for op, asked, size, free, algo, nbytes, time_s, protocol in raw["prices"]}
    except (TypeError, ValueError):  # a damaged entry is a miss
        return {}


def keep_prices() -> None:
    """Keep on disk (arcsim.files' cache) the untagged prices of every topology that gained some since they were
    read, so the next run on it prices nothing twice; runs at the exit of the process that first priced. Keeping
    is optional: a write that fails is skipped without a word."""
    from arcsim.errors import ArcsimError
    from arcsim.files import cache_write, trim_cache

    if os.getpid() not in _KEEPER:
        return
    wrote = False
    for key, cache in list(_PRICED.items()):
        rows = [[op, asked, size, free, r.algo, r.bytes, r.time_s, r.protocol]
                for (op, asked, size, tag, free), r in cache.items() if not tag]
        if len(rows) <= _KEPT.get(key, 0):  # (a tagged copy of a kept price is no new price)
            continue
        with contextlib.suppress(ArcsimError, OSError):
            cache_write(_prices_name(key), {"topology": key[0], "prices": rows}, quiet=True, trim=False)
            wrote = True
        _KEPT[key] = len(rows)
    if wrote:
        with contextlib.suppress(ArcsimError, OSError):
            trim_cache()


def price_records(records: list[CommRecord], topo: Topology, engine: str = "analytic",
                  algorithms: dict[str, str] | None = None) -> list[PricedRecord]:
    """Price each logged collective on ``topo``: the hand-off from a CommLog to the network backends.

    Sizes are per rank, so a log recorded with P simulated workers prices on a topology with any rank
    count: an all-gather's total output is bytes_per_rank × the topology's ranks. ``algorithms`` maps
    an op to an algorithm name (default 'auto': the topology's library decides).
    """
    return Pricer(topo, engine).records(records, algorithms)
