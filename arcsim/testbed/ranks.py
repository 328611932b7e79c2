"""A job's rank processes, forked from a server that imported torch and arcsim's rank workers once.

``python -m arcsim.testbed.validate_worker …`` for each rank spent about 2 s of CPU importing torch before it did
anything, and a validation starts a fresh process per rank for its calibration and for every repeat of every
training (4 ranks, 2 hierarchies, 3 repeats: 28 starts, about a minute of CPU). Forked from a preloaded server
(multiprocessing's forkserver), each rank is still a fresh process of its own, with no state of another run: it takes
its own environment, folder and output file, enters its node's network namespace and the real-time class (what
``ip netns exec NS chrt -f 1`` did), and runs its module as ``python -m`` would.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from arcsim.errors import ArcsimError
from arcsim.processes import forkserver, free_port
from arcsim.testbed import MICROBENCH, VALIDATE_WORKER

CLONE_NEWNET = 0x40000000
POLL_S = 0.05
OUTPUT_SHOWN = 800  # characters of a failed rank's output in the error


@dataclass(frozen=True)
class RankLaunch:
    """One rank: ``python -m module *args`` (``python module *args`` where ``script``: a file's path) with ``env``
    (the whole environment), in network namespace ``netns`` (None: this one), under real-time priority
    ``chrt -f 1`` where ``realtime``."""
    module: str
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    netns: str | None = None
    realtime: bool = False
    script: bool = False


def on_loopback(module: str, args: Sequence[str], ranks: int, script: bool = False) -> list[RankLaunch]:
    """``ranks`` ranks of ``module`` on this machine's loopback, each with the environment torchrun gives it (RANK,
    LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_*, OMP_NUM_THREADS=1)."""
    job = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(ranks),
           "LOCAL_WORLD_SIZE": str(ranks), "OMP_NUM_THREADS": "1"}
    return [RankLaunch(module, tuple(args), {**job, "RANK": str(r), "LOCAL_RANK": str(r)}, script=script)
            for r in range(ranks)]


def run_ranks(launches: Sequence[RankLaunch], timeout: float) -> None:
    """Start every rank at once and wait for all of them, ``timeout`` seconds at most; a rank that fails (or
    outlasts the timeout) is an ArcsimError with its last output, and every rank still running is killed."""
    # arcsim's rank workers, imported once by the server with torch (a validation calibrates, then trains); never the
    # module launched, whose body would run in the server
    ctx = forkserver(["torch", "torch.distributed", MICROBENCH, VALIDATE_WORKER])
    with tempfile.TemporaryDirectory(prefix="arcsim-ranks-") as tmp:
        logs = [Path(tmp) / f"rank{r}.log" for r in range(len(launches))]
        procs = [ctx.Process(target=_rank, args=(launch, str(log), os.getcwd()), name=f"rank{r}")
                 for r, (launch, log) in enumerate(zip(launches, logs, strict=True))]
        try:
            for p in procs:
                p.start()
            deadline = time.monotonic() + timeout
            while True:
                codes = [p.exitcode for p in procs]
                failed = next((r for r, code in enumerate(codes) if code not in (None, 0)), None)
                if failed is not None:
                    raise ArcsimError(f"rank {failed} failed (exit code {codes[failed]}): {_tail(logs[failed])}")
                if None not in codes:
                    return
                if time.monotonic() > deadline:
                    late = [r for r, code in enumerate(codes) if code is None]
                    raise ArcsimError(f"rank {late[0]} (of {len(late)} still running) did not finish within "
                                      f"{timeout:g} s: {_tail(logs[late[0]])}")
                time.sleep(POLL_S)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                if p.pid is not None:
                    p.join()


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-OUTPUT_SHOWN:] if log.exists() else ""


def _rank(launch: RankLaunch, log: str, folder: str) -> None:
    """In the forked rank: its output to ``log``, its namespace, priority, environment and folder, then the module."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if launch.netns is not None:
        enter_netns(launch.netns)
    if launch.realtime:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    os.environ.clear()
    os.environ.update(launch.env)
    os.chdir(folder)
    threads = launch.env.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if "torch" in sys.modules and threads.isdigit() and int(threads) > 0:  # torch read the server's when it loaded
        import torch

        torch.set_num_threads(int(threads))
    sys.argv = [launch.module, *launch.args]
    try:
        if launch.script:
            sys.path.insert(0, str(Path(launch.module).resolve().parent))  # as `python script` does
            runpy.run_path(launch.module, run_name="__main__")
        else:
            sys.path.insert(0, folder)  # as `python -m` does
            sys.modules.pop(launch.module, None)  # the server's import of it: run afresh, as `python -m` would
            runpy.run_module(launch.module, run_name="__main__", alter_sys=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def enter_netns(name: str) -> None:
    """Move this (single-threaded) process into the named network namespace, as ``ip netns exec`` does."""
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into network namespace {name}: {os.strerror(errno)}")
    finally:
        os.close(fd)
