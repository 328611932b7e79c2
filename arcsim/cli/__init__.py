"""The command line: one module per command group, thin (parse, call the library, render)."""

from __future__ import annotations

from typing import Any

__all__ = ["cli", "main"]


def main() -> None:
    """Console entry point: first restart with glibc keeping freed memory and OpenMP waiting passively (before
    torch is imported, so the restart costs milliseconds), then run the command (arcsim.cli.main)."""
    from arcsim.processes import restart_keeping_freed_memory, wait_passively

    standard_streams_open()
    wait_passively()
    restart_keeping_freed_memory()
    from arcsim.cli.main import main as run

    run()


def standard_streams_open() -> None:
    """Results go to standard output: where it was closed (``>&-``) that is one error line, exit 2, before any work
    (a closed standard error is pointed at /dev/null: there is nowhere to say anything)."""
    import os
    import sys

    if sys.stderr is None:
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115 - the process's own stream, open until it exits
    if sys.stdout is None:
        sys.stderr.write("error: standard output is closed, and arcsim writes its results there; redirect it to a "
                         "file or to /dev/null\n")
        sys.exit(2)


def __getattr__(name: str) -> Any:
    if name == "cli":  # the click group, imported on first use: `main` must start light
        from arcsim.cli.main import cli

        return cli
    raise AttributeError(name)
