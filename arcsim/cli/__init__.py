"""The command line: one module per command group, thin (parse, call the library, render)."""

from __future__ import annotations

from typing import Any

__all__ = ["cli", "main"]


def main() -> None:
    """Console entry point: first restart with glibc keeping freed memory and OpenMP waiting passively (before
    torch is imported, so the restart costs milliseconds), then run the command (arcsim.cli.main)."""
    from arcsim.processes import restart_keeping_freed_memory, wait_passively

    wait_passively()
    restart_keeping_freed_memory()
    from arcsim.cli.main import main as run

    run()


def __getattr__(name: str) -> Any:
    if name == "cli":  # the click group, imported on first use: `main` must start light
        from arcsim.cli.main import cli

        return cli
    raise AttributeError(name)
