"""The text nccl-tests prints (all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf), read.

What a log says: the op (the ``# Collective test starting: all_reduce_perf`` line of nccl-tests ≥ 2.17, else the
binary's name anywhere in the text or in the file's name, else the table's columns), the ranks and where they ran
(the ``#  Rank  0 Group  0 Pid … on HOST device 0 [..] GPU`` lines; NCCL_DEBUG=INFO's ``comm … nRanks 16 nNodes 2
localRanks 8`` where present), and the table: one row per size, its columns named by the header line (``size
count type redop root time algbw busbw #wrong`` twice in 2.11 and later; ``error`` for ``#wrong`` and no ``root``
before; ``bytes N type op`` in 1.x). The **out-of-place** time is taken: every version prints it, and it is the
collective as a training job runs it (its own input and output buffers). With NCCL_DEBUG=INFO the log also says the
transport (``Using network IB``, ``Socket``, ``AWS Libfabric``), the channels (``Channel 00/32``) and an algorithm
pinned by NCCL_ALGO. Anything else is no nccl-tests log: one ``error:`` line naming the file, before any work.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from arcsim.errors import ArcsimError
from arcsim.files import read_text

BINARIES = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter",
            "broadcast": "broadcast"}  # nccl-tests' <name>_perf → arcsim's op
TYPE_BYTES = {"int8": 1, "uint8": 1, "char": 1, "f8e4m3": 1, "f8e5m2": 1, "half": 2, "float16": 2, "bfloat16": 2,
              "int32": 4, "uint32": 4, "float": 4, "float32": 4, "int": 4, "int64": 8, "uint64": 8, "double": 8,
              "float64": 8}
COLUMN_NAMES = {"bytes": "size", "n": "count", "op": "redop", "error": "#wrong", "res": "#wrong"}  # 1.x, 2.0–2.10
NCCL_ALGOS = {"ring": "ring", "tree": "tree", "nvls": "nvls", "nvlstree": "nvls"}  # NCCL_ALGO → arcsim's algorithm
TRANSPORTS = {"ib": "rdma", "socket": "tcp", "aws libfabric": "efa", "ofi": "efa", "gpudirecttcpx": "tcpx",
              "fastrak": "tcpx", "tcpxo": "tcpx"}  # NCCL's net plugin name → arcsim's transport family

_STARTING = re.compile(r"#\s*Collective test starting:[ \t]*(\S+)")
_BINARY = re.compile(r"\b(all_reduce|all_gather|reduce_scatter|broadcast|alltoall|sendrecv|hypercube|gather|scatter"
                     r"|reduce)_perf")
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s*(.*)$")
_COMM = re.compile(r"NCCL INFO .*\bnRanks (\d+) nNodes (\d+) localRanks (\d+)")
_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_VIA_NET = re.compile(r"NCCL INFO .* via NET/([^/]+)/")
_CHANNEL = re.compile(r"NCCL INFO Channel \d+/(\d+)")
_ALGO = re.compile(r"NCCL INFO NCCL_ALGO set by environment to (\S+)")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")


@dataclass(frozen=True)
class NcclTestsLog:
    """One nccl-tests run: its op, where its ranks ran, and its out-of-place time per size."""

    path: str
    op: str  # arcsim's name: allreduce, allgather, reducescatter, broadcast
    ranks: int
    nodes: int
    gpu: str  # the device name the Rank lines give ("" when they give none)
    sizes: tuple[int, ...]  # bytes, as nccl-tests counts them (all-gather: the whole output)
    times_us: tuple[float, ...]  # out-of-place
    algo: str = "auto"  # pinned by NCCL_ALGO (ring, tree, nvls), else NCCL's choice
    transport: str = ""  # arcsim's family (rdma, efa, tcpx, tcp) from NCCL_DEBUG=INFO, "" when not said
    network: str = ""  # NCCL's own name for it ("IB", "Socket", "AWS Libfabric")
    channels: int = 0  # from NCCL_DEBUG=INFO's Channel lines, 0 when not said
    nccl_version: str = ""
    avg_busbw_GBps: float | None = None
    notes: tuple[str, ...] = field(default=())  # how the op or the ranks were found, where not said outright

    @property
    def gpus_per_node(self) -> int:
        return self.ranks // self.nodes


def read_log(path: Path) -> NcclTestsLog:
    """The nccl-tests run in the file at ``path`` (one run per file)."""
    return parse(read_text(path, "nccl-tests log", ArcsimError), str(path))


def parse(text: str, where: str) -> NcclTestsLog:
    """The run in ``text`` (``where`` names it in errors); refused with the reason when it is no single nccl-tests
    run of an op arcsim prices."""
    lines = text.splitlines()
    headers = [i for i, line in enumerate(lines) if _is_header(line)]
    if not headers:
        raise ArcsimError(f"{where}: no nccl-tests table (no '#  size  count  type …  time  algbw  busbw' header "
                          f"line); give the output of all_reduce_perf, all_gather_perf, reduce_scatter_perf or "
                          f"broadcast_perf")
    if len(headers) > 1:
        raise ArcsimError(f"{where}: holds {len(headers)} nccl-tests tables; give each run its own file")
    columns = _columns(lines[headers[0]])
    rows = _rows(lines[headers[0] + 1:], columns, where)
    if not rows:
        raise ArcsimError(f"{where}: the nccl-tests table has no rows (did the run fail? the log's end says why)")
    unit = _time_unit(lines[headers[0] + 1] if headers[0] + 1 < len(lines) else "", rows)
    ranks, nodes, gpu, placement = _placement(lines, where)
    op, how = _op(text, where, rows, ranks)
    sizes = tuple(int(r["size"]) for r in rows)
    if len(set(sizes)) != len(sizes):
        raise ArcsimError(f"{where}: size {Counter(sizes).most_common(1)[0][0]} appears twice in one table")
    times = tuple(_time_us(r, unit, where) for r in rows)
    if any(not t > 0 for t in times):
        raise ArcsimError(f"{where}: an out-of-place time is not positive; give the log as nccl-tests wrote it")
    avg = _AVG.search(text)
    network = _last(_NETWORK, lines) or _last(_VIA_NET, lines)
    channels = [int(m[1]) for line in lines if (m := _CHANNEL.search(line))]
    return NcclTestsLog(where, op, ranks, nodes, gpu, sizes, times, _algo(lines, where), _transport(network, where),
                        network, max(channels, default=0), _last(_VERSION, lines),
                        float(avg[1]) if avg else None, tuple(n for n in (how, placement) if n))


def _is_header(line: str) -> bool:
    words = line.lstrip("#").split()
    return line.startswith("#") and bool(words) and words[0] in ("size", "bytes") and "time" in words


def _columns(line: str) -> list[str]:
    """The header's column names, in nccl-tests ≥ 2.11's words."""
    return [COLUMN_NAMES.get(w.lower(), w.lower()) for w in line.lstrip("#").split()]


def _time_unit(units: str, rows: list[dict[str, str]]) -> float:
    """µs per the table's time unit: as the units line under the header says ((us) or (ms)); without one, the unit
    that makes the largest size's time agree with its algbw (GB/s)."""
    if units.startswith("#") and ("(us)" in units or "(ms)" in units):
        return 1.0 if "(us)" in units else 1e3
    last = rows[-1]
    try:
        implied_us = int(last["size"]) / (float(last["algbw"]) * 1e3)
        ratio = implied_us / float(last["time"])
    except (ValueError, ZeroDivisionError):
        return 1.0
    return 1e3 if abs(ratio / 1e3 - 1) < abs(ratio - 1) else 1.0


def _rows(lines: list[str], columns: list[str], where: str) -> list[dict[str, str]]:
    """The table's rows (data lines under the header, up to its end), each by column name; NCCL INFO and other
    lines between them are skipped."""
    needed = columns.index("busbw") + 1
    rows: list[dict[str, str]] = []
    for line in lines:
        words = line.split()
        if line.startswith("#") and rows:
            break  # the table's end (# Out of bounds values, # Avg bus bandwidth)
        if len(words) < 2 or not (words[0].isdigit() and words[1].isdigit()):
            continue
        if len(words) < needed:
            raise ArcsimError(f"{where}: table row {line.strip()!r} has {len(words)} columns, the header names "
                              f"{len(columns)}; give the log as nccl-tests wrote it")
        row: dict[str, str] = {}
        for name, word in zip(columns, words, strict=False):
            row.setdefault(name, word)  # the first time, algbw, busbw: out-of-place
        rows.append(row)
    return rows


def _time_us(row: dict[str, str], unit: float, where: str) -> float:
    try:
        return float(row["time"]) * unit
    except ValueError:
        raise ArcsimError(f"{where}: the out-of-place time {row['time']!r} at size {row['size']} is not a number; "
                          f"give the log as nccl-tests wrote it") from None


def _placement(lines: list[str], where: str) -> tuple[int, int, str, str]:
    """(ranks, nodes, GPU name, how the nodes were found): NCCL_DEBUG=INFO's comm line where present, else the
    Rank lines' hosts."""
    found = [m for line in lines if (m := _RANK.match(line))]
    gpu = Counter(m[3].strip() for m in found).most_common(1)[0][0] if found else ""
    comm = _last_match(_COMM, lines)
    if comm is not None:
        return int(comm[1]), int(comm[2]), gpu, ""
    if not found:
        raise ArcsimError(f"{where}: the log does not say how many ranks ran it (no '#  Rank  0 Group  0 Pid … on "
                          f"HOST device …' lines); give the whole output, header included")
    per_host = Counter(m[2] for m in found)
    if len(set(per_host.values())) > 1:
        raise ArcsimError(f"{where}: the ranks are spread unevenly over hosts "
                          f"({', '.join(f'{h}: {n}' for h, n in per_host.items())}); arcsim prices nodes of "
                          f"equal GPUs")
    return len(found), len(per_host), gpu, f"nodes: the {len(per_host)} host name(s) of the Rank lines"


def _op(text: str, where: str, rows: list[dict[str, str]], ranks: int) -> tuple[str, str]:
    """(arcsim's op, how it was found, "" when the log names its binary)."""
    starting = _STARTING.search(text)
    named = [starting[1]] if starting else list(dict.fromkeys(m[0] for m in _BINARY.finditer(text)))
    if not named:
        named = list(dict.fromkeys(m[0] for m in _BINARY.finditer(Path(where).name)))
    if len(named) > 1:
        raise ArcsimError(f"{where}: names {', '.join(named)}; give each run its own file")
    if named:
        binary = named[0].removesuffix("_mpi").removesuffix("_perf")
        if binary not in BINARIES:
            raise ArcsimError(f"{where}: a {named[0]} run; arcsim prices all_reduce_perf, all_gather_perf, "
                              f"reduce_scatter_perf and broadcast_perf")
        return BINARIES[binary], ""
    return _op_from_table(rows[0], ranks, where)


def _op_from_table(row: dict[str, str], ranks: int, where: str) -> tuple[str, str]:
    """The op by the table's columns: the reduction, the root, and the count per rank against the size."""
    per_rank = int(row.get("count", "0")) * TYPE_BYTES.get(row.get("type", ""), 0)
    size, reduces = int(row["size"]), row.get("redop", "none") not in ("none", "")
    rooted = int(row.get("root", "-1")) >= 0
    if per_rank == size and rooted and not reduces:
        op = "broadcast"
    elif per_rank == size and not rooted and reduces:
        op = "allreduce"
    elif per_rank * ranks == size and not rooted:
        op = "reducescatter" if reduces else "allgather"
    else:
        raise ArcsimError(f"{where}: cannot tell which nccl-tests binary wrote this table; keep its first lines "
                          f"('# Collective test starting: all_reduce_perf') or name the file after it "
                          f"(all_reduce_perf.log)")
    twin = {"allreduce": "sendrecv_perf", "allgather": "alltoall_perf"}.get(op)
    return op, f"op from the table's columns: {op}" + (f" ({twin} prints the same)" if twin else "")


def _algo(lines: list[str], where: str) -> str:
    pinned = _last(_ALGO, lines).lower()
    if not pinned:
        return "auto"
    if pinned not in NCCL_ALGOS:
        raise ArcsimError(f"{where}: NCCL_ALGO={pinned}: arcsim prices NCCL's ring, tree and NVLS one at a time; "
                          f"run nccl-tests with one of them, or without NCCL_ALGO")
    return NCCL_ALGOS[pinned]


def _transport(network: str, where: str) -> str:
    if not network:
        return ""
    family = next((t for name, t in TRANSPORTS.items() if name in network.lower()), None)
    if family is None:
        raise ArcsimError(f"{where}: NCCL ran over network {network!r}, which arcsim does not price (it knows "
                          f"IB, Socket, AWS Libfabric and GPUDirectTCPX/FasTrak)")
    return family


def _last_match(pattern: re.Pattern[str], lines: list[str]) -> re.Match[str] | None:
    return next((m for line in reversed(lines) if (m := pattern.search(line))), None)


def _last(pattern: re.Pattern[str], lines: list[str]) -> str:
    m = _last_match(pattern, lines)
    return m[1] if m else ""
