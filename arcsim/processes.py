"""Small process helpers shared by the sweep runner, the emulated cluster and the testbed."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on right now (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def physical_memory_bytes() -> int:
    """This machine's memory (what a request for more than that cannot get)."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGTERM this process when its parent dies (Linux; a no-op elsewhere), so workers
    never outlive a killed command; exit now if the parent is already gone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)


PR_SET_PDEATHSIG = 1
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameters


def keep_freed_memory() -> None:
    """Ask glibc's allocator to keep freed blocks for reuse instead of handing them back to the kernel.

    By default every block over 32 MB is mapped fresh and unmapped when freed, so each gradient-sized
    temporary is page-faulted in again page by page: measured on ResNet-50's trace, 3.0 M page faults and
    6.3 s of system time against 7.8 s of work for four compressor runs; kept, 0.1 M and 0.4 s, and the
    runs take 5.1 s instead of 8.7 s (peak RSS 4.4 GB instead of 3.9 GB). A no-op where there is no
    glibc (musl, macOS).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_MAX, 0)
    mallopt(M_TRIM_THRESHOLD, 2**31 - 1)


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
