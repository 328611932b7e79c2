"""Helpers shared by the command modules: the console, JSON output, option types, progress bars."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from arcsim.catalog import MODELS, SCOPES
from arcsim.cli.paths import JsonTarget
from arcsim.collectives.limits import DES_EVENTS, EVENTS_PER_SECOND, STORED_MESSAGES
from arcsim.files import write_atomic
from arcsim.topology import GRAMMAR
from arcsim.units import UnitError, parse_size

if TYPE_CHECKING:  # imported where a bar is made: 0.1 s that a refused argument should not wait on
    from tqdm import tqdm

FORCE_TRAINING_HELP = ("Train even where the estimate (printed first: memory from the model's parameters × workers, "
                       "time from its FLOPs) exceeds the memory this machine has available.")
TOPOLOGY_HELP = f"Preset name (arcsim topo list), YAML path, or a name in the grammar {GRAMMAR.split()[0]}."

TABLE_WIDTH = 100  # columns for tables when stdout is no terminal and COLUMNS is unset


def table_width() -> int:
    """Columns for tables: COLUMNS where set, else the terminal's, else TABLE_WIDTH (output to a file or a pipe)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit():
        return int(columns)
    if sys.stdout.isatty():
        return os.get_terminal_size(sys.stdout.fileno()).columns
    return TABLE_WIDTH


console = Console(width=table_width())  # measured again by every command (cli()): one process may run several


class Verbosity:
    """Set once by the top-level ``--quiet``: no status notes and no progress bars, only results and errors."""

    quiet = False


def note(message: str) -> None:
    """A status line on stderr (keeps stdout clean for --json -); silent under --quiet."""
    if not Verbosity.quiet:
        click.echo(message, err=True)


def progress_bar(total: int | None, desc: str, unit: str) -> tqdm:
    """A tqdm bar on stderr, hidden when stderr is no terminal or under --quiet."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=True if Verbosity.quiet else None, file=sys.stderr)


json_option = click.option(
    "--json", "json_out", type=JsonTarget(), default=None,
    help="Write the result as JSON to FILE, or to stdout with - (then no table is printed).")


def tables_wanted(json_out: str | None) -> bool:
    """Whether the human tables go to stdout: not when stdout carries the JSON."""
    return json_out != "-"


def write_json(obj: Any, json_out: str | None) -> None:
    """The result as JSON: to stdout for ``-``, else atomically to the file (and a note saying so)."""
    if json_out is None:
        return
    text = json.dumps(obj, indent=1)
    if json_out == "-":
        click.echo(text)
        return
    write_atomic(Path(json_out), text + "\n")
    note(f"wrote {json_out}")


@contextmanager
def step_progress(desc: str, unit: str = "step") -> Iterator[Callable[[int, int], None]]:
    """A tqdm bar on stderr driven by ``progress(done, total)`` callbacks."""
    bar: tqdm | None = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = progress_bar(total, desc, unit)
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        if bar is not None:
            bar.close()


def finite_number(kind: click.ParamType, value: object, param: click.Parameter | None, ctx: click.Context | None,
                  hint: str = "") -> float:
    """``value`` as a finite float, or ``kind``'s one-line failure: what Count and Number both start from."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        kind.fail(f"{value!r} is not a number{hint}", param, ctx)
    if not math.isfinite(number):
        kind.fail(f"{value!r} is not a finite number", param, ctx)
    return number


class Count(click.ParamType):
    """A whole number that may be written 1e6 or 25600000, finite and within [minimum, maximum]."""

    name = "count"

    def __init__(self, minimum: int = 1, maximum: int | None = None, why_max: str = "") -> None:
        self.minimum, self.maximum, self.why_max = minimum, maximum, why_max

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        number = finite_number(self, value, param, ctx, " (e.g. 1e6)")
        if number != int(number):
            self.fail(f"{value!r} is not a whole number", param, ctx)
        count = int(number)
        if count < self.minimum:
            self.fail(f"must be at least {self.minimum} (got {count:,})", param, ctx)
        if self.maximum is not None and count > self.maximum:
            self.fail(f"must be at most {self.maximum:,}{self.why_max} (got {count:,})", param, ctx)
        return count


class Number(click.ParamType):
    """A finite real number, optionally bounded: ``Number(above=0, maximum=1)`` is (0, 1]."""

    name = "number"

    def __init__(self, minimum: float | None = None, maximum: float | None = None, above: float | None = None) -> None:
        self.minimum, self.maximum, self.above = minimum, maximum, above

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        number = float(finite_number(self, value, param, ctx))
        low_ok = (self.above is None or number > self.above) and (self.minimum is None or number >= self.minimum)
        if not low_ok or (self.maximum is not None and number > self.maximum):
            self.fail(f"{self.allowed()} (got {number:g})", param, ctx)
        return number

    def allowed(self) -> str:
        """The interval in words: 'must lie in (0, 1]', 'must be greater than 0', 'must be at most 10'."""
        low = f"({self.above:g}" if self.above is not None else f"[{self.minimum:g}" if self.minimum is not None else ""
        if low and self.maximum is not None:
            return f"must lie in {low}, {self.maximum:g}]"
        if self.above is not None:
            return f"must be greater than {self.above:g}"
        if self.minimum is not None:
            return f"must be at least {self.minimum:g}"
        return f"must be at most {self.maximum:g}" if self.maximum is not None else "must be a number"


class ByteSize(click.ParamType):
    """A size with its unit, e.g. 4KB or 1MiB, as whole bytes (at least one)."""

    name = "size"

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        try:
            size = parse_size(value if isinstance(value, str) else f"{value}B")
        except UnitError as exc:
            self.fail(str(exc), param, ctx)
        if size < 1:
            self.fail(f"{value!r} holds nothing; give at least 1B", param, ctx)
        if size != int(size):
            self.fail(f"{value!r} is {size:g} bytes, not a whole number of bytes", param, ctx)
        return int(size)


class ListOf(click.ParamType):
    """A comma list, each value parsed by ``item`` (a Count, Number, ByteSize, …); ``length`` fixes how many, ``unique``
    refuses repeats. One error names the option and the value at fault."""

    name = "list"

    def __init__(self, item: click.ParamType, length: int | None = None, unique: bool = False,
                 example: str = "") -> None:
        self.item, self.length, self.unique, self.example = item, length, unique, example

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        if isinstance(value, tuple):
            return value
        parts = [v.strip() for v in str(value).split(",")]
        if not any(parts) or (self.length is not None and len(parts) != self.length):
            want = f"{self.length} comma-separated values" if self.length else "comma-separated values"
            self.fail(f"takes {want} (e.g. {self.example}); got {value!r}", param, ctx)
        out = []
        for i, part in enumerate(parts, start=1):
            try:
                out.append(self.item.convert(part, None, None))
            except click.BadParameter as exc:
                self.fail(f"value {i} of {value!r}: {exc.message}", param, ctx)
        if self.unique and len(set(out)) != len(out):
            twice = next(v for v in out if out.count(v) > 1)
            self.fail(f"gives {twice} twice in {value!r}; each value is used once", param, ctx)
        return tuple(out)


class SizeGrid(ListOf):
    """Per-rank sizes to measure a collective at and fit: two or more different ones (a fit needs two points)."""

    def __init__(self) -> None:
        super().__init__(ByteSize(), unique=True, example="4KB,256KB,1MB")

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        sizes = super().convert(value, param, ctx)
        if len(sizes) < 2:
            self.fail(f"needs at least two different sizes (a fit needs two points), e.g. {self.example}", param, ctx)
        return sizes


def given_options(*options: str | tuple[str, str]) -> list[str]:
    """Which of ``options`` the command line set (not left at their defaults), as flags: each a parameter's name
    (its flag: --name-with-dashes) or a pair (flag, parameter name)."""
    source = click.get_current_context().get_parameter_source
    pairs = [o if isinstance(o, tuple) else (f"--{o.replace('_', '-')}", o) for o in options]
    return [flag for flag, name in pairs if source(name) not in (None, click.core.ParameterSource.DEFAULT)]


def optimizer_options(command: Callable) -> Callable:
    """--optimizer, --lr, --momentum, --betas and --weight-decay: how the training between recorded steps runs."""
    for option in reversed((
        click.option("--optimizer", type=click.Choice(["sgd", "adamw"]), default=None,
                     help="sgd (with momentum) or adamw (default: the model's; LLaMAs train with AdamW)."),
        click.option("--lr", type=Number(above=0), default=None, help="Learning rate (default: the model's)."),
        click.option("--momentum", type=Number(minimum=0, maximum=1), default=None, help="SGD momentum (0.9)."),
        click.option("--betas", type=ListOf(Number(minimum=0, maximum=1), length=2, example="0.9,0.95"),
                     default=None, help="AdamW betas (0.9,0.999)."),
        click.option("--weight-decay", type=Number(minimum=0), default=None, help="Weight decay (0)."),
    )):
        command = option(command)
    return command


MODEL_HELP = (f"One of the zoo ({', '.join(MODELS)}), or your own: path/to/file.py:build or package.module:build, "
              "a callable returning an nn.Module.")


def model_arg_options(command: Callable) -> Callable:
    """--model-arg and --data: the factory's arguments and the user's batches, for a model of their own."""
    command = click.option("--data", default=None, metavar="FILE.py:NAME",
                           help="Your batches instead of a built-in dataset: batches(batch_size, seed) yielding "
                                "dicts (model(**b)), tuples (model(*b)) or tensors; the forward returns the "
                                "loss.")(command)
    return click.option("--model-arg", "model_args", multiple=True, metavar="KEY=VALUE",
                        help="An argument for your model's factory (repeat for several).")(command)


def optimizer_settings(given: dict[str, Any]) -> dict[str, Any]:
    """The optimizer options that were given, as TrainingConfig fields (the defaults stay its own)."""
    return {k: v for k, v in given.items() if v is not None}


DENSITY = Number(above=0, maximum=1)  # k/d: a fraction of the gradient's elements
INPUT_SIZE = Count(maximum=4096, why_max=" (an image side or a sequence length; larger ones do not fit in memory here)")
input_size_option = click.option(
    "--input-size", "--seq-len", "input_size", type=INPUT_SIZE, default=None,
    help="Image side or sequence length (--seq-len: the same, a GPT's tokens per example); default: the dataset's.")


def model_options(command: Callable) -> Callable:
    """--model (required), its --model-arg and --data, --dataset and --input-size: the model a command prices."""
    command = input_size_option(command)
    command = click.option("--dataset", default=None,
                           help="The built-in dataset its forward takes (default: the model's own).")(command)
    return click.option("--model", required=True, help=MODEL_HELP)(model_arg_options(command))


scope_option = click.option(
    "--scope", type=click.Choice(SCOPES), default="tensor", show_default=True,
    help="Top-k family (topk, randk, gaussiank, star, var, arctopk): k per layer (tensor, as the reference "
         "implementations) or one k over each whole bucket.")


compressor_option = click.option(
    "--option", "compressor_options", multiple=True, metavar="KEY=VALUE",
    help="One of a compressor's own options, for every chosen compressor that takes it (repeatable): qsgd's "
         "levels and block (its paper's bucket size, e.g. block=512; arctopk's block is its rows' length), "
         "terngrad's clip, signum's beta, ... (docs/compressors.md).")


def parse_compressor_options(given: tuple[str, ...]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as options: a whole number as int, another number as float, true/false as bool, else
    the text."""
    out: dict[str, Any] = {}
    for item in given:
        key, eq, text = item.partition("=")
        if not eq or not key.strip() or not text.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE (e.g. block=512)", param_hint="'--option'")
        key, text = key.strip(), text.strip()
        if key == "scope":
            raise click.BadParameter("give the scope with --scope", param_hint="'--option'")
        if key == "rank":  # adaptive, in the default list, takes it only for an inner compressor that has one
            raise click.BadParameter("rank is not set by --option yet (arcsim compress --rank sets it)",
                                     param_hint="'--option'")
        value: Any = text
        if text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            for kind in (int, float):
                try:
                    value = kind(text)
                    break
                except ValueError:
                    pass
        if isinstance(value, float) and not math.isfinite(value):
            raise click.BadParameter(f"{item!r}: the value must be a finite number", param_hint="'--option'")
        out[key] = value
    return out


force_option = click.option(
    "--force", is_flag=True,
    help=f"Price even past the work limits (closed form: {STORED_MESSAGES / 1e6:.0f} M stored messages; DES: "
         f"{DES_EVENTS / 1e6:.0f} M events, ~{DES_EVENTS / EVENTS_PER_SECOND / 60:.0f} min here).")


@contextmanager
def des_progress() -> Iterator[Callable[[str, float, float], None]]:
    """``follow(algorithm, fraction, events)`` for long DES runs: one note with the estimate, then a bar."""
    bars: dict[str, tqdm] = {}

    def follow(name: str, done: float, events: float) -> None:
        if name not in bars:
            note(f"DES {name}: about {events / 1e6:,.1f} M events, ~{events / EVENTS_PER_SECOND:,.0f} s here")
            bars[name] = progress_bar(100, f"DES {name} (% of the closed form's time)", "%")
        bars[name].update(round(done * 100) - bars[name].n)

    try:
        yield follow
    finally:
        for bar in bars.values():
            bar.close()


def _library_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from arcsim.collectives.libraries import get_library

    return get_library(value, " for --library").name


library_option = click.option(
    "--library", default=None, callback=_library_name,
    help="How collectives run: nccl, gloo, mpi (Open MPI's tuned rules) or ideal (the cheapest algorithm on bare "
         "links); default: the topology's (docs/collectives.md).")
