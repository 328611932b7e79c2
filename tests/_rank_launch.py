"""Worker scripts' ranks forked from a server that has torch and arcsim imported already: ``python script`` for each
rank spent about 1.5 s of CPU importing torch before it did anything, a tenth of the suite's CPU on two cores.
Each rank still runs the script as ``__main__`` with its own argv, in a process of its own (output to a file)."""

from __future__ import annotations

import multiprocessing
import os
import runpy
import sys
from multiprocessing.context import ForkServerContext
from pathlib import Path

PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "arcsim.hooks", "arcsim.compressors.registry",
           "arcsim.compressors.memory", "arcsim.comm.distributed", "arcsim.models", "arcsim.traces.synthetic",
           "torch.distributed.fsdp", "arcsim.sharding.fsdp_probe"]  # the last two: fsdp_probe.probe's ranks, forked
# from the same server (a process has one)
_context: ForkServerContext | None = None


def context() -> ForkServerContext:
    """The forkserver of this process (started on first use, with PRELOAD imported once)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _run(script: str, argv: list[str], log: str, environ: dict[str, str], folder: str) -> None:
    os.environ.clear()  # the caller's, as a process it started would have (the server's are older)
    os.environ.update(environ)
    os.chdir(folder)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.path.insert(0, str(Path(script).parent))  # as `python script` puts the script's folder first
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")
    sys.stdout.flush()
    sys.stderr.flush()


def run_ranks(script: Path, argvs: list[list[str]], logs: list[Path], timeout: float) -> list[tuple[int, str]]:
    """Run ``script`` once per argv at once; each one's exit code and what it printed."""
    ctx = context()
    here = (dict(os.environ), os.getcwd())
    procs = [ctx.Process(target=_run, args=(str(script), argv, str(log), *here))
             for argv, log in zip(argvs, logs, strict=True)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
    finally:  # a timeout or an interrupted test leaves no rank behind
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return [(p.exitcode if p.exitcode is not None else -9, log.read_text() if log.exists() else "")
            for p, log in zip(procs, logs, strict=True)]
