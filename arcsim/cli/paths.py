"""The one rule of every command's files: no output may be one of the files the command reads.

Each parameter's type says what its value is. An output type (:class:`JsonTarget`, :class:`OutputPath`) names
what the command writes: a file, its companions, or the files it writes into a folder. Every other text value is
read as naming inputs: the value itself, each piece of a comma list, the FILE of ``FILE.py:NAME`` and of
``KEY=FILE``, whatever names an existing file; an :class:`InputPath` is read even as a folder (the files in it
it reads), and a :class:`Reads` value is also resolved as its command resolves it (a preset topology found on
$ARCSIM_TOPOLOGY_PATH, a trace name found in $ARCSIM_TRACE_DIR). The folders arcsim reads by environment are
inputs of every command. :func:`guard_commands` puts the check in front of every command of the tree once, so a
new command or option has it without code of its own: after parsing, before the command's own work, an output
that is an input by identity (a link, a hard link, another relative name) is one ``error:`` line, and every input
is protected for the rest of the run (:func:`arcsim.files.protecting`): a write the check could not foresee
is refused too.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import click

from arcsim.errors import ArcsimError
from arcsim.files import generated_traces_dir, protecting, trace_candidates, unwritable_reason

MAX_FILES_PER_FOLDER = 10_000  # an input folder's files compared at most (a folder of a user's is read so far)


@dataclass(frozen=True)
class Place:
    """A file (``patterns`` None), or the files inside folder ``path`` whose relative paths match ``patterns``."""

    path: Path
    patterns: tuple[str, ...] | None = None
    via: str = ""  # how the command came to it, where not directly: "named in sweep.yaml"

    def files(self) -> Iterator[Path]:
        """The existing regular files this place holds (a folder's, as far as MAX_FILES_PER_FOLDER)."""
        if self.patterns is None:
            if self.path.is_file():
                yield self.path
            return
        if not self.path.is_dir():
            return
        count = 0
        for pattern in self.patterns:
            for found in self.path.glob(pattern):
                if found.is_file():
                    yield found
                    count += 1
                    if count >= MAX_FILES_PER_FOLDER:
                        return

    def holds(self, file: Path) -> bool:
        """Whether writing this place may write ``file`` (an existing file): it is the file, by identity, or it lies
        in the folder with a name the folder's patterns match."""
        if self.patterns is None:
            try:
                return os.path.samefile(self.path, file)
            except OSError:
                return False  # not there yet: no file is replaced
        try:
            inside = PurePosixPath(Path(os.path.realpath(file)).relative_to(os.path.realpath(self.path)))
        except ValueError:
            return False
        return any(_matches(inside, pattern) for pattern in self.patterns)


def _matches(relative: PurePosixPath, pattern: str) -> bool:
    """Glob matching part by part (``*.png`` is a file in the folder itself, not one in a subfolder)."""
    parts = PurePosixPath(pattern).parts
    return len(parts) == len(relative.parts) and all(map(fnmatch.fnmatchcase, relative.parts, parts))


# -- what parameters write ------------------------------------------------------------------------------
class Writes:
    """A parameter type whose value names what the command writes."""

    def places(self, value: str) -> list[Place]:
        raise NotImplementedError


class JsonTarget(click.Path, Writes):
    """``--json FILE`` or ``--json -`` (standard output); a FILE is checked for writability up front."""

    name = "FILE|-"

    def __init__(self) -> None:
        super().__init__(dir_okay=False, allow_dash=True)

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        value = super().convert(value, param, ctx)
        if value != "-":
            reason = unwritable_reason(Path(value), False)
            if reason:
                self.fail(f"cannot write {value}: {reason}; choose a writable place, or - for stdout", param, ctx)
        return value

    def places(self, value: str) -> list[Place]:
        return [] if value == "-" else [Place(Path(value))]


class OutputPath(click.Path, Writes):
    """A path the command will write, refused up front, before any work, if it cannot be written: a file (and the
    ``companions`` it writes beside it, as suffixes that replace its own), or a folder and the ``writes`` patterns
    of the files the command writes into it."""

    def __init__(self, directory: bool = False, writes: tuple[str, ...] = ("*",),
                 companions: tuple[str, ...] = ()) -> None:
        super().__init__(file_okay=not directory, dir_okay=directory)
        self.directory, self.writes, self.companions = directory, writes, companions

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        if str(value).strip() in ("", "-"):
            self.fail(f"{value!r} is not a place to write; give a path (only --json takes - for standard output)",
                      param, ctx)
        value = super().convert(value, param, ctx)
        reason = unwritable_reason(Path(value), self.directory)
        if reason:
            self.fail(f"cannot write {value}: {reason}; choose a writable place", param, ctx)
        return value

    def places(self, value: str) -> list[Place]:
        path = Path(value)
        if self.directory:
            return [Place(path, self.writes)]
        return [Place(path), *(Place(path.with_suffix(suffix)) for suffix in self.companions)]


# -- what parameters read -------------------------------------------------------------------------------
Expander = Callable[[Path], list[Place]]


class InputPath(click.Path):
    """A file or folder the command reads; a folder's ``reads`` patterns are the files it reads in it, and
    ``expand(path)`` the places a file names in turn (a sweep file's traces and topologies)."""

    def __init__(self, directory: bool = False, file: bool = True, reads: tuple[str, ...] = ("*",),
                 expand: Expander | None = None) -> None:
        super().__init__(file_okay=file, dir_okay=directory)
        self.reads, self.expand = reads, expand

    def places(self, value: str) -> list[Place]:
        path = Path(value)
        if path.is_dir():
            return [Place(path, self.reads)]
        more = self.expand(path) if self.expand is not None and path.is_file() else []
        return [Place(path), *(dataclasses.replace(p, via=f"named in {value}") for p in more)]


def topology_places(value: str) -> list[Place]:
    """The files a topology value reads (a comma list of presets, YAML files, names and instances)."""
    from arcsim.topology import TopologyError, topology_files

    found = []
    for spec in value.split(","):
        try:
            found += [Place(p) for p in topology_files(spec.strip())]
        except TopologyError:
            continue  # the command says what is wrong with it
    return found


def trace_places(value: str) -> list[Place]:
    """The trace files a trace value reads (a comma list of files and names)."""
    found = (next((c for c in trace_candidates(name.strip()) if c.exists()), None) for name in value.split(","))
    return [Place(path) for path in found if path is not None]


RESOLVERS: dict[str, Callable[[str], list[Place]]] = {"topology": topology_places, "trace": trace_places}


class Reads(click.types.StringParamType):
    """A text value that names inputs the way its command resolves them: ``kind`` is a key of RESOLVERS."""

    def __init__(self, kind: str) -> None:
        if kind not in RESOLVERS:
            raise ValueError(f"no resolver for {kind!r}")
        self.kind = kind

    def places(self, value: str) -> list[Place]:
        return RESOLVERS[self.kind](value)


def named_files(value: str) -> list[Place]:
    """What any text value names: itself, the pieces of a comma list, and each side of ``:`` and ``=`` in them,
    where that is an existing file."""
    pieces = {value, *value.split(",")}
    for sep in (":", "="):
        pieces |= {part for piece in pieces for part in piece.split(sep)}
    return [Place(Path(p)) for p in sorted(pieces) if p.strip() not in ("", ".", "-") and os.path.isfile(p)]


def environment_places() -> list[tuple[str, Place]]:
    """The folders every command reads by environment: the traces folder and the topology search path."""
    from arcsim.topology import TopologyError, preset_dirs

    found = [("$ARCSIM_TRACE_DIR" if os.environ.get("ARCSIM_TRACE_DIR") else "the traces arcsim made",
              Place(generated_traces_dir(), ("*.npz",)))]
    try:
        folders = preset_dirs()
    except TopologyError:
        folders = []  # the command that looks a preset up says what is wrong
    found += [("$ARCSIM_TOPOLOGY_PATH", Place(d, ("*.yaml", "instances/*.yaml"))) for d in folders]
    return found


# -- the check ------------------------------------------------------------------------------------------
def _label(param: click.Parameter) -> str:
    return param.opts[0] if isinstance(param, click.Option) else (param.name or "argument").upper()


def _texts(value: Any) -> list[str]:
    if isinstance(value, (tuple, list)):
        return [str(v) for v in value if v is not None]
    return [] if value is None or isinstance(value, bool) else [str(value)]


def reads_and_writes(ctx: click.Context) -> tuple[list[tuple[str, Place]], list[tuple[str, Place]]]:
    """(what reads, place) for every input and (option, place) for every output of the parsed command ``ctx``."""
    inputs: list[tuple[str, Place]] = []
    outputs: list[tuple[str, Place]] = []
    for param in ctx.command.params:
        kind = param.type
        for text in _texts(ctx.params.get(param.name or "")):
            if isinstance(kind, Writes):
                outputs += [(f"{_label(param)} {text}", place) for place in kind.places(text)]
            elif isinstance(kind, (click.types.StringParamType, click.Path)):
                declared = kind.places(text) if isinstance(kind, (InputPath, Reads)) else []
                inputs += [(_label(param), place) for place in [*declared, *named_files(text)]]
    return inputs + environment_places(), outputs


def check_files(ctx: click.Context) -> list[Path]:
    """Refuse, in one line and before any work, an output of the command that is one of its inputs; returns the
    input files, to protect from the writes of the rest of the run."""
    inputs, outputs = reads_and_writes(ctx)
    read = [(" ".join(filter(None, (who, place.via))), file) for who, place in inputs for file in place.files()]
    for option, place in outputs:
        for who, file in read:
            if place.holds(file):
                name = "" if place.patterns is None else f" (it writes {', '.join(place.patterns)} there)"
                raise ArcsimError(f"{option}{name} would replace {file}, which this command reads ({who}); write "
                                  "the output to another place")
    return [file for _, file in read]


def _guarded(callback: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        with protecting(check_files(click.get_current_context())):
            return callback(*args, **kwargs)

    run.checks_files = True  # type: ignore[attr-defined]
    return run


def commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterable[tuple[tuple[str, ...], click.Command]]:
    """Every command of the tree under ``group`` with its words (``("trace", "merge")``)."""
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


def guard_commands(group: click.Group) -> None:
    """Put :func:`check_files` in front of every command of the tree (once; idempotent)."""
    for _, command in commands(group):
        if command.callback is not None and not getattr(command.callback, "checks_files", False):
            command.callback = _guarded(command.callback)
