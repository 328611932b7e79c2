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
