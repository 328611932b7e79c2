"""The command line: one module per command group, thin (parse, call the library, render)."""

from arcsim.cli.main import cli, main

__all__ = ["cli", "main"]
