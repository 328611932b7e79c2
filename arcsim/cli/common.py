"""Helpers shared by the command modules: the console, JSON output, option types, progress bars."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click
from rich.console import Console
from tqdm import tqdm

from arcsim.catalog import SCOPES
from arcsim.errors import ArcsimError
from arcsim.files import unwritable_reason

console = Console(width=None if sys.stdout.isatty() else 130)


def emit_json(obj: object) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False))


def note(message: str) -> None:
    """A status line on stderr (keeps stdout clean for --json)."""
    click.echo(message, err=True)


@contextmanager
def step_progress(desc: str, unit: str = "step") -> Iterator[Callable[[int, int], None]]:
    """A tqdm bar on stderr driven by ``progress(done, total)`` callbacks."""
    bar: tqdm | None = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=desc, unit=unit, disable=None, file=sys.stderr)
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        if bar is not None:
            bar.close()


def number_list(text: str, what: str, kind: type = float) -> tuple:
    """A non-empty comma list of numbers (``kind`` float or int), or one clear error naming the option."""
    example, noun = ("0,1,2", "whole numbers") if kind is int else ("1e-3,1e-2,0.1", "comma-separated numbers")
    try:
        values = tuple(kind(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ArcsimError(f"{what} takes {noun}, e.g. {example}; got {text!r}") from None
    if not values:
        raise ArcsimError(f"{what} is empty")
    return values


class Count(click.ParamType):
    """A whole number that may be written 1e6 or 25600000."""

    name = "count"

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number (e.g. 1e6)", param, ctx)
        if number != int(number):
            self.fail(f"{value!r} is not a whole number", param, ctx)
        return int(number)


scope_option = click.option(
    "--scope", type=click.Choice(SCOPES), default="tensor", show_default=True,
    help="Top-k family (topk, randk, gaussiank, star, var, arctopk): k per layer (tensor, as the reference "
         "implementations) or one k over each whole bucket.")


class OutputPath(click.Path):
    """A path the command will write: refused up front, before any work, if it cannot be written."""

    def __init__(self, directory: bool = False) -> None:
        super().__init__(file_okay=not directory, dir_okay=directory)
        self.directory = directory

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        value = super().convert(value, param, ctx)
        reason = unwritable_reason(Path(value), self.directory)
        if reason:
            self.fail(f"cannot write {value}: {reason}; choose a writable place", param, ctx)
        return value
