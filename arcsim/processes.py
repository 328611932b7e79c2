"""Small process helpers shared by the sweep runner, the emulated cluster and the testbed."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from multiprocessing.context import ForkServerContext, SpawnContext

from arcsim.errors import ArcsimError


def torch_version() -> str:
    """The installed torch's version, from its package metadata (importing torch takes a second); torch's own where
    it has none (a torch on PYTHONPATH)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        import torch

        return str(torch.__version__)


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on right now (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or taskset's share), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (no affinity to ask where the system has none: macOS)
        return os.cpu_count() or 1


_PRELOADED: list[str] = []  # what this process's forkserver imports when it starts: every caller's asks


def forkserver(preload: Iterable[str]) -> ForkServerContext | SpawnContext:
    """multiprocessing's forkserver, told to import ``preload`` too: its processes fork from a server that imported
    torch once instead of each importing it (about 2 s of CPU a process). A process has one server, started on first
    use with what was asked until then; a module it lacks is imported by the process that needs it. Where there is
    no forkserver (Windows): spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    _PRELOADED.extend(m for m in preload if m not in _PRELOADED)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(_PRELOADED))
    return ctx


def physical_memory_bytes() -> int:
    """This machine's memory (what a request for more than that cannot get)."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def die_with_parent(owner_pid: int) -> None:
    """End this worker when ``owner_pid`` ends (Linux; a no-op elsewhere), so workers never outlive a killed command:
    the kernel SIGTERMs it when its parent dies, and where ``owner_pid`` is not the parent (a worker its forkserver
    forked, which outlives the owner while any worker lives) a thread watching the owner's pidfd does; exits now if
    the owner is gone already (a zombie too)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() == owner_pid:
        return
    try:
        owner = os.pidfd_open(owner_pid)
    except ProcessLookupError:
        os._exit(1)
    except (OSError, AttributeError):  # a kernel before 5.3: the parent-death signal alone
        return
    threading.Thread(target=_end_with, args=(owner,), name="die-with-owner", daemon=True).start()


def _end_with(owner: int) -> None:
    select.select([owner], [], [])  # readable once the owner has ended
    os.kill(os.getpid(), signal.SIGTERM)


def wait_passively() -> None:
    """Have torch's OpenMP threads sleep while they wait instead of spinning, unless ``OMP_WAIT_POLICY`` is set
    already; read when torch loads, so call it before. Where other work shares the cores, spinning threads are
    descheduled mid-loop: the default `arcsim run`, cold, measured its compressors in 124 s with spinning and 1.9 s
    passive (load average 4.5 on 2 cores; 1.6 s on a quiet machine)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


PR_SET_PDEATHSIG = 1
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters


KEEP_FREED = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"  # no mmap'd blocks; trim past 64 GiB


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):
        return False


def _repeatable(argv: list[str]) -> bool:
    """Whether starting ``argv`` again runs the same command: a script, a module or ``-c`` code, not an
    interactive session or a program read from standard input (already consumed)."""
    return len(argv) >= 2 and argv[1] != "-" and not sys.flags.interactive


def restart_keeping_freed_memory() -> None:
    """Start this command over at once (``exec``: same process, same arguments) with glibc's allocator told by
    ``GLIBC_TUNABLES`` to keep freed memory for reuse; a no-op where it is told already (or told otherwise
    by the user), without glibc, or where the command line cannot be repeated.

    By default every block over 32 MB is mapped fresh and unmapped when freed, so each gradient-sized
    temporary is page-faulted in again page by page. :func:`keep_freed_memory` says the same through
    mallopt, but mallopt cannot set a trim threshold above 2 GiB, and freeing a few gradient-sized
    temporaries together passes that: on ResNet-50's `arcsim run`, 4.9 M page faults and 22 s of system
    time with mallopt, 1.3 M (the peak heap, touched once) and 8 s with the tunables; 81 s → 75 s."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc" in tunables or not _glibc() or not sys.executable or not _repeatable(sys.orig_argv):
        return
    os.environ["GLIBC_TUNABLES"] = f"{tunables}:{KEEP_FREED}" if tunables else KEEP_FREED
    try:
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    except OSError:  # not startable again: go on, with mallopt
        os.environ["GLIBC_TUNABLES"] = tunables


def keep_freed_memory() -> None:
    """Ask glibc's allocator, in this process already started, to keep freed blocks for reuse instead of
    handing them back to the kernel (as :func:`restart_keeping_freed_memory`, up to mallopt's 2 GiB trim
    threshold; nothing where the tunables already say so). On four compressor runs over ResNet-50's trace:
    3.0 M page faults and 6.3 s of system time against 7.8 s of work; kept, 0.1 M and 0.4 s. A no-op where
    there is no glibc (musl, macOS)."""
    if "glibc.malloc.trim_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_MAX, 0)
    mallopt(M_TRIM_THRESHOLD, 2**31 - 1)


def release_freed_memory() -> None:
    """Hand the freed memory glibc keeps (:func:`restart_keeping_freed_memory`) back to the kernel now: after
    work whose blocks are model-sized, which the next such block, placed elsewhere in a fragmented heap,
    would otherwise add to (a 1 B model's streamed trace step: 18.9 GB peak over three measurements,
    11.4 GB released after each). A no-op without glibc."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def signals_interrupt(*signals: signal.Signals) -> Iterator[None]:
    """Within the block, these signals raise KeyboardInterrupt (so clean-up code runs); restored after."""
    previous = {sig: signal.signal(sig, raise_interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


RENDEZVOUS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")  # what torchrun sets for each rank


def torchrun_world() -> int | None:
    """This process's world size when it is a rank of a torchrun job, None outside one. A RANK or WORLD_SIZE
    without the rest of torchrun's variables, or values that are not ranks, is refused: a stray variable
    would otherwise start a job that waits for peers that never come."""
    given = [v for v in RENDEZVOUS if v in os.environ]
    if not given:
        return None
    rank, world = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    if len(given) < len(RENDEZVOUS) or not (rank.isdigit() and world.isdigit() and int(rank) < int(world)):
        raise ArcsimError(f"the environment holds {', '.join(f'{v}={os.environ[v]}' for v in given)} but not a "
                          f"torchrun rank ({', '.join(RENDEZVOUS)} with 0 ≤ RANK < WORLD_SIZE); unset them, or "
                          "launch with torchrun")
    return int(world)


def refuse_stray_rank(command: str) -> None:
    """``command`` launches its own workers: a RANK or WORLD_SIZE left in the environment is refused before any
    work (the workers get their own; the user meant a torchrun job, or forgot an export)."""
    stray = [f"{v}={os.environ[v]}" for v in ("RANK", "WORLD_SIZE") if v in os.environ]
    if stray:
        raise ArcsimError(f"{command} launches its own workers and gives each its rank, but the environment holds "
                          f"{', '.join(stray)}; unset them (under torchrun, run the command the workers run)")
