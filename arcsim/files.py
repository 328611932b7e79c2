"""Where arcsim's files live, and writing them so that no reader ever sees half of one.

- Data shipped with the package (presets, GPU catalogue, kernel tables, the default trace, measured
  profiles) is read from ``arcsim/data`` as a package resource; the presets and the traces have their source
  in the top-level ``topologies/`` and ``traces/``, which the build copies there: an editable and a wheel
  install read the same files (:func:`packaged`).
- What arcsim makes for itself (kept results, traces captured on demand, ``--params`` samples) goes to the
  user cache: $ARCSIM_CACHE_DIR, else $XDG_CACHE_HOME/arcsim, else ~/.cache/arcsim — never into the package
  or the working directory. Kept results are gzipped JSON capped at CACHE_CAP_BYTES, the least recently
  used dropped first: compressor measurements (arcsim.run.cache) and model workloads
  (arcsim.models.workload) name their own files, and ``arcsim cache info|clear`` sees them all.
- Writes are atomic (beside the final name, then renamed); results tables grow row by row and survive a kill.
"""

from __future__ import annotations

import csv
import errno
import gzip
import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from importlib.resources import files as _resource_files
from pathlib import Path
from typing import Any, Literal

import yaml

from arcsim.errors import ArcsimError

PARTIAL = re.compile(r"^\.(?P<stem>.+)\.partial-(?P<pid>\d+)(?P<suffix>.*)$")  # what atomic_path writes first
JOURNAL = ".writing"  # in RESULTS_FOLDER: one record per atomic write in progress, naming its partial file
_PROTECTED: set[tuple[int, int]] = set()  # (device, inode) of the files this process reads: never written over


def name_max(folder: Path) -> int:
    """The longest file name (in bytes) the filesystem holding ``folder`` (or its nearest existing parent) takes."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def partial_path(path: Path, pid: int | None = None) -> Path:
    """The hidden file beside ``path`` that a write fills before it is renamed onto ``path`` (same suffix, so writers
    that look at it still work; the writer's PID, so a partial left by a killed process is known as such). A name
    too long to take the additions is cut and told apart by a hash of the whole."""
    pid = os.getpid() if pid is None else pid
    name = f".{path.stem}.partial-{pid}{path.suffix}"
    if len(os.fsencode(name)) > name_max(path.parent):
        digest = hashlib.sha256(os.fsencode(path.name)).hexdigest()[:12]
        name = f".{path.stem[:64]}~{digest}.partial-{pid}{path.suffix[:32]}"
    return path.with_name(name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):  # gone, or a number no process can have
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _journal() -> Path:
    return results_dir() / JOURNAL


def _begin_write(partial: Path) -> Path | None:
    """Record that this process fills ``partial`` (so that, if it is killed, arcsim can later prove the file its
    own); best effort: where the cache cannot be written nothing is recorded, and such a partial is never removed."""
    folder = _journal()
    for _ in range(2):  # another process may remove the empty folder between our mkdir and our write
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, record = tempfile.mkstemp(prefix=f"{os.getpid()}-", suffix=".txt", dir=folder)
        except OSError:
            continue
        try:
            os.write(fd, os.fsencode(os.path.abspath(partial)) + b"\n")
        except OSError:
            os.close(fd)
            _end_write(Path(record))
            return None
        os.close(fd)
        return Path(record)
    with suppress(OSError):
        folder.rmdir()
    return None


def _end_write(record: Path | None) -> None:
    if record is None:
        return
    record.unlink(missing_ok=True)
    with suppress(OSError):
        record.parent.rmdir()  # only when no other write is in progress


def stale_partials(of: Path | None = None) -> list[tuple[Path, Path]]:
    """(partial file, its record) for each write of arcsim's whose process is gone (only those of ``of``, if given):
    what a killed write left. A file is one of them only where arcsim's journal recorded it, by its exact path,
    name and PID: a file merely named like a partial is never touched."""
    folder = _journal()
    if not folder.is_dir() or folder.is_symlink():
        return []
    found = []
    for record in folder.iterdir():
        pid = record.name.split("-", 1)[0]
        if not pid.isdigit() or not record.is_file() or record.is_symlink() or _alive(int(pid)):
            continue
        try:
            partial = Path(os.fsdecode(record.read_bytes().rstrip(b"\n")))
        except OSError:
            continue
        m = PARTIAL.match(partial.name)
        if not partial.is_absolute() or not m or m["pid"] != pid:
            continue
        if of is None or partial == Path(os.path.abspath(partial_path(of, int(pid)))):
            found.append((partial, record))
    return found


def remove_stale(partials: Iterable[tuple[Path, Path]]) -> list[Path]:
    """Remove each stale partial that is still a plain file, and its record; returns the files removed."""
    removed = []
    for partial, record in partials:
        if partial.is_file() and not partial.is_symlink():
            partial.unlink(missing_ok=True)
            removed.append(partial)
        _end_write(record)
    return removed


@contextmanager
def protecting(paths: Iterable[Path]) -> Iterator[None]:
    """While the block runs, :func:`atomic_path` and :class:`AppendOnlyCSV` refuse to write over these files (the
    inputs of a command), by identity, whatever name reaches them: the CLI's up-front check names the option; this
    catches the rest."""
    added = set()
    for path in paths:
        with suppress(OSError):
            st = os.stat(path)
            added.add((st.st_dev, st.st_ino))
    added -= _PROTECTED
    _PROTECTED.update(added)
    try:
        yield
    finally:
        _PROTECTED.difference_update(added)


def _refuse_protected(path: Path) -> None:
    try:
        st = os.stat(path)
    except OSError:
        return
    if (st.st_dev, st.st_ino) in _PROTECTED:
        raise ArcsimError(f"{path} is one of this command's inputs: writing it would replace what is read; write "
                          "to another file")


def link_loop(path: Path) -> bool:
    """Whether ``path`` is a symbolic link that never reaches a file (it leads back to itself)."""
    if not path.is_symlink():
        return False
    try:
        os.path.realpath(path, strict=True)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def write_error(path: Path, exc: OSError) -> ArcsimError:
    """One line for a write that failed (a full disk, a read-only place, a vanished folder)."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    fix = "free some space there or choose another place" if full else "choose another place"
    return ArcsimError(f"cannot write {path}: {exc.strerror or exc}; {fix}")


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Where to write ``path`` so that no reader sees half of it, as shell redirection would treat the name: a
    symbolic link is followed (its target is written, the link stays), a pipe, device or socket is written in
    place (streamed), and a regular file is filled beside the final name, then renamed onto it. A write that
    fails (full disk, read-only place) is one :class:`ArcsimError` line; its partial file is removed, and so are
    partials of the same name that a killed earlier write of arcsim's left (as its journal proves). One of the
    process's inputs (:func:`protect_inputs`) or a link that loops is refused."""
    path = Path(path)
    if link_loop(path):
        raise ArcsimError(f"cannot write {path}: it is a symbolic link that leads back to itself; remove the link "
                          "or choose another name")
    _refuse_protected(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    if target.exists() and not target.is_file() and not target.is_dir():  # a pipe, device or socket: stream to it
        try:
            yield target
        except OSError as exc:
            raise write_error(path, exc) from None
        return
    tmp = partial_path(target)
    record = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(stale_partials(target))
        record = _begin_write(tmp)
        yield tmp
        os.replace(tmp, target)
    except OSError as exc:
        raise write_error(path, exc) from None
    finally:
        if tmp.exists():
            tmp.unlink()
        _end_write(record)


def write_atomic(path: Path, text: str, check: Callable[[Path], object] | None = None) -> Path:
    """Write ``text`` to ``path`` atomically; ``check(tmp)`` may refuse the content before it lands."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
        if check is not None:
            check(tmp)
    return path


class AppendOnlyCSV:
    """A CSV that grows by whole rows, each batch fsynced, so an interrupted run keeps what it finished;
    a row cut off by a kill mid-write is dropped when the file is next opened (``repair``)."""

    def __init__(self, path: Path, columns: Sequence[str], extra: Literal["raise", "ignore"] = "raise") -> None:
        self.path, self.columns, self.extra = Path(path), list(columns), extra

    def repair(self) -> None:
        """Drop a last row without its newline (a write cut off by a kill)."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as fh:
                fh.truncate(data.rfind(b"\n") + 1)

    def append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Whole rows at the end; a write that fails (a full disk) is one error line, and the rows already there
        stay (a row it cut off is dropped by the next ``repair``)."""
        _refuse_protected(self.path)
        new = not self.path.exists() or self.path.stat().st_size == 0
        try:
            with self.path.open("a", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=self.columns, extrasaction=self.extra)
                if new:
                    writer.writeheader()
                writer.writerows(rows)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise write_error(self.path, exc) from None


def unwritable_reason(path: Path, directory: bool) -> str | None:
    """Why ``path`` (a file, or a directory when ``directory``) cannot be written, or None if it can.

    Probes for real — creates what is missing and a scratch file, then removes them — so a check made
    before long work leaves nothing behind and catches what permission bits alone do not (/proc, full or
    read-only mounts)."""
    longest = name_max(Path(path).parent)
    too_long = next((len(os.fsencode(part)) for part in Path(path).parts if len(os.fsencode(part)) > longest), None)
    if too_long is not None:
        return f"a name in it is {too_long} bytes long, past the {longest} this filesystem takes"
    try:
        return _unwritable(Path(path), directory)
    except OSError as exc:  # what the filesystem says of the name itself (too long a path, a loop on the way)
        return exc.strerror or str(exc)


def _unwritable(path: Path, directory: bool) -> str | None:
    if link_loop(path):
        return "it is a symbolic link that leads back to itself"
    path = Path(os.path.realpath(path))  # a link: its target is what is written
    if path.exists() and path.is_dir() != directory:
        return f"{path} is {'a file' if directory else 'a directory'}"
    if path.exists() and not directory and not path.is_file():  # a pipe or device: written in place
        return None if os.access(path, os.W_OK) else "permission denied"
    target = path if directory else path.parent
    missing, d = [], target
    while not d.exists():
        missing.append(d)
        d = d.parent
    if not d.is_dir():
        return f"{d} is not a directory"
    created: list[Path] = []
    try:
        for m in reversed(missing):
            m.mkdir()
            created.append(m)
        with tempfile.NamedTemporaryFile(dir=target):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        for m in reversed(created):
            m.rmdir()
    return None


MAX_YAML_NODES = 100_000  # what a document may expand to through its aliases; a config file needs far fewer


class _StrictLoader(yaml.SafeLoader):
    """YAML as a configuration reader should take it: a key given twice is an error (not "the last wins"),
    and aliases may not expand a document past MAX_YAML_NODES (an alias bomb is refused, not expanded)."""

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None and _expanded_size(node) > MAX_YAML_NODES:
            raise yaml.YAMLError(f"its aliases expand it past {MAX_YAML_NODES:,} values; write the values out")
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise yaml.YAMLError(f"key {key!r} is given twice (line {key_node.start_mark.line + 1}); "
                                         "keep one")
                seen.add(key)
        return super().construct_mapping(node, deep)


def _expanded_size(root: yaml.Node) -> int:
    """How many values ``root`` holds with every alias expanded (shared nodes counted each time they are used)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        kids = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                else list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        if children_done:
            sizes[id(node)] = min(1 + sum(sizes.get(id(k), 1) for k in kids), MAX_YAML_NODES + 1)
        else:
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in sizes)
    return sizes[id(root)]


def read_text(path: Path, what: str, error: type[Exception]) -> str:
    """The UTF-8 text of ``path``; missing, a folder, unreadable or not text is one ``error`` line."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{what} {path} is a directory; give a file")
    if not path.is_file():
        raise error(f"{what} {path} does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"{what} {path} is not a text file (not UTF-8)") from None
    except OSError as exc:
        raise error(f"{what} {path} cannot be read ({exc.strerror})") from None


def parse_yaml(text: str, where: str, error: type[Exception]) -> Any:
    """A YAML document (None when empty), strictly: bad syntax, duplicate keys and alias bombs are one line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"{where} is malformed YAML{at}: {problem}") from None


def read_yaml(path: Path, what: str, error: type[Exception]) -> Any:
    """The YAML document of ``path`` (None when empty), read as :func:`read_text` and :func:`parse_yaml` do."""
    return parse_yaml(read_text(path, what, error), f"{what} {path}", error)


def read_json(path: Path, what: str, error: type[Exception], expect: type = dict) -> Any:
    """The JSON value of ``path``, which must be an ``expect`` (a dict by default); anything else is one line."""
    text = read_text(path, what, error)
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise error(f"{what} {path} is not valid JSON ({exc})") from None
    if not isinstance(value, expect):
        noun = {"dict": "an object", "list": "a list"}.get(expect.__name__, expect.__name__)
        raise error(f"{what} {path} holds a JSON {type(value).__name__}, not {noun}")
    return value


# -- results kept between commands ------------------------------------------------------------------
CACHE_CAP_BYTES = 2 * 2**30
CACHE_SUFFIX = ".json.gz"
RESULTS_FOLDER = "arcsim-results"  # inside the cache folder: the only place arcsim keeps (and removes) results
ENTRY_NAME = re.compile(r"^(workload-|prices-)?[0-9a-f]{32}\.json\.gz$")
ENTRY_MARK = b'{"arcsim": "cache-entry"'  # how every entry's JSON begins: a file without it is not arcsim's
TRACE_INDEX = "trace-facts.json"  # in RESULTS_FOLDER: facts about trace files by (path, size, mtime)


# shipped data whose source is a top-level folder beside arcsim/ (the build copies it into arcsim/data: setup.py)
SOURCE_FOLDERS = ("topologies", "traces", "examples")


def packaged(*parts: str) -> Path:
    """A file or folder shipped inside the package, under ``arcsim/data`` (installs are unpacked, so a path). The
    presets and the default trace are there in a wheel; in a checkout or an editable install they are read from
    their top-level source folders beside the package (never from the working directory)."""
    package = Path(str(_resource_files("arcsim")))
    if parts and parts[0] in SOURCE_FOLDERS and not (package / "data" / parts[0]).is_dir() \
            and (package.parent / parts[0]).is_dir():
        return package.parent.joinpath(*parts)
    return package.joinpath("data", *parts)


def generated_traces_dir() -> Path:
    """Where traces arcsim makes itself are written: $ARCSIM_TRACE_DIR, else ``traces/`` of the user cache."""
    if os.environ.get("ARCSIM_TRACE_DIR"):
        return Path(os.environ["ARCSIM_TRACE_DIR"])
    return cache_dir() / "traces"


def trace_candidates(value: str) -> list[Path]:
    """Where a ``--trace`` value is looked for, in order: a path with a folder in it is that file alone; a bare name
    is looked up in the working directory, then among the traces arcsim made, then among those it ships."""
    given = Path(value)
    if given.parent != Path():
        return [given]
    return [given, generated_traces_dir() / given.name, packaged("traces", given.name)]


def cache_dir() -> Path:
    if os.environ.get("ARCSIM_CACHE_DIR"):
        return Path(os.environ["ARCSIM_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "arcsim"


def writable_cache_dir() -> Path:
    """The cache folder, checked writable before any work that keeps results or makes traces there."""
    directory = cache_dir()
    reason = unwritable_reason(directory, directory=True)
    if reason:
        raise ArcsimError(f"cannot write the cache folder {directory} ({reason}); set ARCSIM_CACHE_DIR to a "
                          "writable folder")
    return directory


def cache_key(fields: Mapping[str, Any]) -> str:
    """A cache file's name for what its content depends on (JSON-able ``fields``; others by ``str``)."""
    body = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def results_dir() -> Path:
    """The folder of kept results inside the cache folder: arcsim removes files there only by their exact name
    and content, never anything else in the cache folder (which may be a folder of the user's)."""
    return cache_dir() / RESULTS_FOLDER


def cache_read(name: str) -> Any | None:
    """The object kept as ``name``, or None (absent, unreadable, or not an entry arcsim wrote); a read marks it
    recently used."""
    path = results_dir() / f"{name}{CACHE_SUFFIX}"
    try:
        entry = json.loads(gzip.decompress(path.read_bytes()))
        os.utime(path)
    except (OSError, ValueError, EOFError):
        return None
    if not isinstance(entry, dict) or entry.get("arcsim") != "cache-entry" or entry.get("name") != name:
        return None
    return entry.get("value")


def cache_write(name: str, obj: Any, quiet: bool = False, trim: bool = True) -> None:
    """Keep ``obj`` (JSON-able) as ``name``, then (``trim``) drop arcsim's least recently used entries past
    CACHE_CAP_BYTES (:func:`trim_cache`: once after many writes). Keeping is optional: a write that fails (a full
    disk) is a warning on stderr (none if ``quiet``), never the end of the work."""
    body = json.dumps({"arcsim": "cache-entry", "name": name, "value": obj}).encode()
    try:
        with atomic_path(results_dir() / f"{name}{CACHE_SUFFIX}") as tmp:
            tmp.write_bytes(gzip.compress(body))
    except ArcsimError as exc:
        if not quiet:
            print(f"warning: a result was not kept in the cache ({exc}); the next run measures it again",
                  file=sys.stderr)
        return
    if trim:
        trim_cache()


def trim_cache() -> None:
    """Drop arcsim's least recently used entries while they hold more than CACHE_CAP_BYTES."""
    if sum(p.stat().st_size for p in _named_entries()) <= CACHE_CAP_BYTES:
        return  # under the cap by names alone: no entry's content needs reading on every write
    files = cache_entries()
    total = sum(p.stat().st_size for p in files)
    for path in files:  # oldest first
        if total <= CACHE_CAP_BYTES:
            break
        total -= path.stat().st_size
        path.unlink(missing_ok=True)


def file_stamp(path: Path) -> str:
    """What a file fact is kept under: the file's path, size and modification time as they are now."""
    path = path.resolve()
    stat = path.stat()
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


def _fact_index() -> dict[str, Any]:
    """The cache's index of facts about large files, by file_stamp (empty where absent or damaged)."""
    try:
        index = json.loads((results_dir() / TRACE_INDEX).read_text())
    except (OSError, ValueError):
        index = {}
    return index if isinstance(index, dict) else {}  # a damaged index is a miss


def known_file_fact(path: Path, fact: str) -> Any:
    """``fact`` about ``path`` as the file is now, if remember_file_fact kept it (so a large file is read once);
    else None."""
    kept = _fact_index().get(file_stamp(path))
    return kept.get(fact) if isinstance(kept, dict) else None


def remember_file_fact(stamp: str, fact: str, value: Any) -> None:
    """Keep ``fact`` (JSON-able) about the file as ``stamp`` (file_stamp, taken before it was read) says it was;
    nothing where the cache cannot be written (it is found again next time)."""
    index = _fact_index()
    kept = index.get(stamp)
    index[stamp] = {**(kept if isinstance(kept, dict) else {}), fact: value}
    with suppress(ArcsimError):  # write_atomic makes the folder; a failure is one ArcsimError
        write_atomic(results_dir() / TRACE_INDEX, json.dumps(index))


def _named_entries() -> list[Path]:
    """Regular files in the results folder named as entries are (their content not yet read)."""
    directory = results_dir()
    if not directory.is_dir():
        return []
    return [p for p in directory.iterdir() if ENTRY_NAME.match(p.name) and not p.is_symlink() and p.is_file()]


def _marked(path: Path) -> bool:
    """Whether the content of ``path`` begins as every entry arcsim keeps does."""
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read(len(ENTRY_MARK)) == ENTRY_MARK
    except (OSError, EOFError):
        return False


def cache_entries() -> list[Path]:
    """arcsim's kept results, least recently used first (nothing else in the cache folder is counted)."""
    return sorted((p for p in _named_entries() if _marked(p)), key=lambda p: p.stat().st_mtime)


def cache_partials() -> list[Path]:
    """Partial files that killed writes of arcsim's left, wherever they were writing (its journal names them)."""
    return [partial for partial, _ in stale_partials() if partial.is_file() and not partial.is_symlink()]


def check_cache_folder() -> Path:
    """The cache folder, refused in one line where it cannot be one (a file, a link that loops or leads nowhere)."""
    directory = cache_dir()
    if link_loop(directory):
        problem = "a symbolic link that leads back to itself"
    elif directory.is_symlink() and not directory.exists():
        problem = f"a symbolic link to {os.readlink(directory)}, which does not exist"
    elif directory.exists() and not directory.is_dir():
        problem = "not a folder"
    else:
        return directory
    raise ArcsimError(f"the cache folder {directory} is {problem}; set ARCSIM_CACHE_DIR to a folder (or fix the "
                      "link)")


def cache_clear() -> tuple[list[Path], int]:
    """Remove arcsim's kept results, its trace-facts index and partial files killed writes of arcsim's left;
    returns (the files removed, their bytes). Nothing else in the cache folder, nor anywhere else, is touched."""
    check_cache_folder()
    files = cache_entries()
    index = results_dir() / TRACE_INDEX
    if index.is_file() and not index.is_symlink():
        files.append(index)
    size = sum(p.stat().st_size for p in files)
    for path in files:
        path.unlink(missing_ok=True)
    stale = stale_partials()
    size += sum(p.stat().st_size for p, _ in stale if p.is_file() and not p.is_symlink())
    return [*files, *remove_stale(stale)], size
