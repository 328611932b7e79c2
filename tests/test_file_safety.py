"""arcsim never deletes, replaces or truncates a file it did not write: the cache owns only its own entries,
outputs go where the user pointed (links followed, pipes and devices streamed to), an output that names an
input is refused, a full disk is one error line that keeps finished work, and a damaged cache is a miss.
Every case is on a path arcsim does not own."""

from __future__ import annotations

import gc
import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli

from arcsim import files
from arcsim.errors import ArcsimError
from arcsim.run import cache as measurements
from arcsim.traces.format import open_trace

SHIPPED_TRACE = files.packaged("traces", "cnn-digits-small.npz")
DEAD_PID = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have it


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder the user also keeps files in."""
    folder = tmp_path / "mine"
    folder.mkdir()
    monkeypatch.setenv("ARCSIM_CACHE_DIR", str(folder))
    return folder


def user_files(folder: Path) -> dict[str, bytes]:
    """Files of the user's, beside and inside arcsim's results folder, named as arcsim's own are named."""
    (folder / files.RESULTS_FOLDER).mkdir(parents=True, exist_ok=True)
    made = {
        "photos.json.gz": gzip.compress(b'{"album": 1}'),
        "traces.json": b'{"mine": true}',
        f"{files.RESULTS_FOLDER}/{'a' * 32}.json.gz": gzip.compress(b'{"not": "arcsim"}'),
        f"{files.RESULTS_FOLDER}/notes.txt": b"keep me",
    }
    for name, data in made.items():
        (folder / name).write_bytes(data)
    return made


def test_cache_clear_and_eviction_remove_only_arcsims_entries(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = user_files(cache)
    files.cache_write("b" * 32, {"x": 1})
    files.cache_write("workload-" + "c" * 32, {"y": 2})
    assert len(files.cache_entries()) == 2
    cap = files.CACHE_CAP_BYTES
    monkeypatch.setattr(files, "CACHE_CAP_BYTES", 1)  # every write now evicts down to the cap
    files.cache_write("d" * 32, {"z": 3})
    assert [p.name for p in files.cache_entries()] == []
    monkeypatch.setattr(files, "CACHE_CAP_BYTES", cap)
    files.cache_write("e" * 32, {"z": 4})
    assert len(files.cache_clear()[0]) == 1 and files.results_dir().parent == cache
    for name, data in mine.items():
        assert (cache / name).read_bytes() == data, name


def killed_write(path: Path) -> Path:
    """The partial file a write of ``path`` leaves when its process is killed in the middle of it."""
    script = ("import os, signal, sys\nfrom pathlib import Path\nfrom arcsim.files import atomic_path\n"
              "with atomic_path(Path(sys.argv[1])) as tmp:\n    tmp.write_text('half')\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True)
    assert done.returncode == -9, done.stderr
    (partial,) = path.parent.glob(f".{path.stem}.partial-*{path.suffix}")
    return partial


def test_the_cache_cli_counts_and_clears_partials_of_killed_writes_only(cache: Path, tmp_path: Path) -> None:
    mine = user_files(cache)
    traces = cache / "traces"
    traces.mkdir()
    killed = killed_write(traces / "resnet50.npz")  # a write whose process is gone
    elsewhere = killed_write(tmp_path / "out.json")  # an output of arcsim's, killed beside the user's files
    running = traces / f".resnet18.partial-{os.getpid()}.npz"  # named as a write still going on
    running.write_bytes(b"being written")
    lookalikes = [traces / f".notes.partial-{DEAD_PID}.txt",  # named as arcsim names partials, but not arcsim's
                  traces / f".x.partial-{10 ** 30}.npz"]  # a PID no system has
    for path in lookalikes:
        path.write_bytes(b"the user's")
    files.cache_write("f" * 32, {"v": 1})
    info = json.loads(run_cli("cache", "info", "--json", "-").stdout)
    assert (info["entries"], info["partial_files"]) == (1, 2)
    done = run_cli("cache", "clear", env={"ARCSIM_TRACE_DIR": str(traces)})
    assert done.returncode == 0, done.stderr
    assert str(traces) in done.stderr and str(tmp_path) in done.stderr  # the folders it removed from
    assert not killed.exists() and not elsewhere.exists() and running.exists()
    assert all(path.read_bytes() == b"the user's" for path in lookalikes)
    assert not (files.results_dir() / files.JOURNAL).exists()  # the records went with their partials
    for name, data in mine.items():
        assert (cache / name).read_bytes() == data, name


@pytest.mark.parametrize("make", ["file", "loop", "dangling"])
def test_a_cache_folder_that_is_no_folder_is_said_as_such(tmp_path: Path, make: str) -> None:
    where = tmp_path / "cache"
    if make == "file":
        where.write_text("a file of the user's")
    else:
        where.symlink_to(where if make == "loop" else tmp_path / "gone")
    for command in (("cache", "info"), ("cache", "clear")):
        done = run_cli(*command, env={"ARCSIM_CACHE_DIR": str(where)})
        assert done.returncode == 2 and done.stderr.count("error:") == 1, done.stderr
        assert f"the cache folder {where} is" in done.stderr and "ARCSIM_CACHE_DIR" in done.stderr
    assert make != "file" or where.read_text() == "a file of the user's"


def test_a_damaged_cache_is_a_miss(cache: Path) -> None:
    files.cache_write("1" * 32, {"records": "not a list", "other": 1})  # an entry of another shape
    assert measurements.load("1" * 32) is None
    (files.results_dir() / f"{'2' * 32}.json.gz").write_bytes(b"not gzip")
    assert files.cache_read("2" * 32) is None
    (files.results_dir() / files.TRACE_INDEX).write_text("[1, 2, 3]")  # an index of the wrong JSON type
    assert open_trace(SHIPPED_TRACE).workers > 0  # (its checked checksum is remembered there)


def test_a_traces_identity_follows_its_content_not_its_path(tmp_path: Path) -> None:
    """The measurement cache names a trace by its members' checksums: a copy elsewhere is the same trace, one
    changed gradient is another (and the changed file is still a trace that opens)."""
    copy, changed = tmp_path / "copy.npz", tmp_path / "changed.npz"
    shutil.copy(SHIPPED_TRACE, copy)
    with zipfile.ZipFile(SHIPPED_TRACE) as src, zipfile.ZipFile(changed, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "gradients.npy":
                data = data[:-4] + np.float32(0.5).tobytes()  # the last gradient of the last step
            dst.writestr(info, data)
    assert measurements.trace_hash(copy) == measurements.trace_hash(SHIPPED_TRACE)
    assert measurements.trace_hash(changed) != measurements.trace_hash(SHIPPED_TRACE)
    assert open_trace(changed).elements == open_trace(SHIPPED_TRACE).elements


def test_output_through_a_link_writes_the_target_and_keeps_the_link(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    done = run_cli("topo", "list", "--json", str(link))
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())[0]["name"]


def into_a_pipe(fifo: Path, *args: str) -> tuple[subprocess.CompletedProcess, bytes]:
    """Run ``arcsim ARGS`` with a FIFO at ``fifo`` (named in ARGS) and a reader on it: the run and what it read."""
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    done = run_cli(*args, timeout=120)
    reader.join(timeout=60)
    return done, got[0] if got else b""


def test_output_into_a_pipe_streams_and_into_a_device_writes_in_place(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    done, got = into_a_pipe(fifo, "topo", "list", "--json", str(fifo))
    assert done.returncode == 0, done.stderr
    assert stat.S_ISFIFO(fifo.stat().st_mode) and json.loads(got)[0]["name"]
    done = run_cli("topo", "list", "--json", "/dev/null")
    assert done.returncode == 0, done.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_trace_captured_into_a_pipe_streams_and_the_command_ends(tmp_path: Path) -> None:
    """The trace is not read back from the pipe to say what it holds: that would wait for a writer forever."""
    from arcsim.traces.format import open_trace

    fifo = tmp_path / "pipe.npz"
    done, got = into_a_pipe(fifo, "trace", "capture", "--model", "mlp", "-w", "2", "-s", "1", "-o", str(fifo))
    assert done.returncode == 0 and "streamed: not read back" in done.stderr, done.stderr
    (tmp_path / "got.npz").write_bytes(got)
    assert open_trace(tmp_path / "got.npz").workers == 2


def test_an_output_that_names_an_input_is_refused_before_work(tmp_path: Path) -> None:
    trace = tmp_path / "t.npz"
    shutil.copy(SHIPPED_TRACE, trace)
    before = trace.read_bytes()
    for output in ("--json", "--csv"):
        done = run_cli("run", "--trace", str(trace), output, str(trace), cwd=str(tmp_path))
        assert done.returncode == 2 and done.stderr.count("error:") == 1, done.stderr
        assert f"would replace {trace}, which this command reads (--trace)" in done.stderr
    part = tmp_path / "rank0.pt"
    part.write_bytes(b"a recording part")
    alias = tmp_path / "out.npz"
    alias.symlink_to(part)
    done = run_cli("trace", "merge", str(part), "-o", str(alias))
    assert done.returncode == 2 and "which this command reads (PARTS)" in done.stderr, done.stderr
    assert trace.read_bytes() == before and part.read_bytes() == b"a recording part"


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A tiny filesystem with no space left (a tmpfs: needs root)."""
    where = tmp_path / "full"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                      capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        with (where / "filler").open("wb", buffering=0) as fh, pytest.raises(OSError):
            while True:
                fh.write(b"\0" * 4096)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_disk_is_one_error_line_and_leaves_no_partial_file(full_disk: Path) -> None:
    out = full_disk / "topologies.json"
    done = run_cli("topo", "list", "--json", str(out))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("error:") == 1 and "No space left" in done.stderr
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]


def test_a_trace_on_a_full_disk_lets_go_of_its_file_without_a_second_error(full_disk: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The half-written zip is dropped with the partial file: nothing left for the garbage collector to try to
    finish (which printed 'Exception ignored … No space left' after the error line)."""
    from arcsim.compressors.layout import Layer
    from arcsim.traces.format import TraceWriter

    def write(path: Path) -> None:
        with TraceWriter(path, {"steps": 1, "workers": 2}, (Layer("w", (50_000,), 0),), "fp32") as writer:
            writer.write_step(torch.ones(2, 50_000), [0.0, 0.0], 0.0, 0.0, [0.0])

    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(ArcsimError, match="No space left") as caught:
        write(full_disk / "t.npz")
    del caught  # its traceback holds the writer
    gc.collect()
    assert unraisable == []
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]


def test_a_full_cache_is_a_warning_not_the_end_of_the_work(full_disk: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ARCSIM_CACHE_DIR", str(full_disk))
    (full_disk / files.RESULTS_FOLDER).mkdir()
    files.cache_write("9" * 32, {"big": "x" * 100_000})
    assert "was not kept in the cache" in capsys.readouterr().err
    assert files.cache_entries() == [] and list((full_disk / files.RESULTS_FOLDER).iterdir()) == []


def test_a_write_removes_the_partial_a_killed_write_of_the_same_file_left(cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "table.csv"
    killed = killed_write(out)
    alive = files.partial_path(out, 1)  # PID 1 runs: its write is not ours to remove
    alive.write_text("in progress")
    other = killed_write(tmp_path / "notes.csv")  # another file's partial: left for its own next write
    lookalike = files.partial_path(out, DEAD_PID)  # named as a killed write's would be, but never recorded
    lookalike.write_text("the user's")
    files.write_atomic(out, "a,b\n")
    assert out.read_text() == "a,b\n" and not killed.exists() and alive.exists() and other.exists()
    assert lookalike.read_text() == "the user's"


def test_an_output_name_too_long_for_the_filesystem_is_refused_before_work(tmp_path: Path) -> None:
    long_name = "r" * 300 + ".json"
    done = run_cli("topo", "list", "--json", str(tmp_path / long_name))
    assert done.returncode == 2 and done.stderr.count("error:") == 1 and "Traceback" not in done.stderr
    assert "bytes long, past the 255 this filesystem takes" in done.stderr
    near = tmp_path / ("n" * 250 + ".json")  # fits, but its partial's name would not without cutting
    files.write_atomic(near, "{}")
    assert near.read_text() == "{}" and [p.name for p in tmp_path.iterdir()] == [near.name]


def test_a_closed_standard_output_is_one_error_line_before_any_work() -> None:
    done = subprocess.run([sys.executable, "-m", "arcsim", "topo", "list"], capture_output=False,
                          stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1), timeout=120)
    assert done.returncode == 2 and done.stderr.count("error:") == 1 and "standard output is closed" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_trace_damaged_after_its_run_is_refused_though_every_measurement_is_cached(tmp_path: Path,
                                                                                      cache: Path) -> None:
    """open_trace(check_later=True) answers before the gradients' checksum is read: the trace is refused at its
    first read of gradients, and by a run (once the model is counted, beside the check) whose measurements the
    cache holds from before the damage — the zip directory's CRC, and so the trace's identity, unchanged."""
    from arcsim.run.analysis import Analysis
    from arcsim.run.config import RunConfig
    from arcsim.traces.format import CHECKSUM_FACT, TraceError

    copy = tmp_path / "mine.npz"
    shutil.copy(SHIPPED_TRACE, copy)
    config = RunConfig(trace=str(copy), compressors=("dense", "topk"), policy="none", ratios=(0.01,))
    Analysis(config, announce=lambda _: None).run()
    assert Analysis(config, announce=lambda _: None).measuring_work()[0] == 0  # every measurement cached
    assert files.known_file_fact(copy, CHECKSUM_FACT) is True
    identity = measurements.trace_hash(copy)
    raw = bytearray(copy.read_bytes())
    at = raw.index(b"NUMPY") + 4096
    raw[at:at + 64] = bytes(range(64))
    copy.write_bytes(bytes(raw))  # (a new mtime: the checksum is read again)
    assert measurements.trace_hash(copy) == identity and files.known_file_fact(copy, CHECKSUM_FACT) is None
    trace = open_trace(copy, check_later=True)  # no refusal yet …
    for _ in range(2):
        with pytest.raises(TraceError, match="checksum"):
            next(trace.steps_iter())  # … but at the first read, and every one after
    assert files.known_file_fact(copy, CHECKSUM_FACT) is False  # the verdict kept: refused at once next time
    with pytest.raises(TraceError, match="checksum"):
        open_trace(copy, check_later=True)
    (files.results_dir() / files.TRACE_INDEX).unlink()  # the verdict forgotten: the run's own check refuses it
    with pytest.raises(TraceError, match="checksum"):
        Analysis(config, announce=lambda _: None)


def test_a_trace_whose_checksum_is_still_being_read_is_forked_and_pickled_whole(tmp_path: Path, cache: Path,
                                                                                monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    """A process forked while the checksum's thread reads finds the trace intact by reading it itself (the thread
    is not there), and keeps no verdict the parent has not reached; a pickled copy is a checked trace."""
    import pickle
    import time

    from arcsim.traces import format as trace_format
    from arcsim.traces.format import CHECKSUM_FACT

    intact = trace_format._gradients_intact

    def slow(path: Path) -> bool:
        time.sleep(0.5)
        return intact(path)

    monkeypatch.setattr(trace_format, "_gradients_intact", slow)
    copy = tmp_path / "mine.npz"
    shutil.copy(SHIPPED_TRACE, copy)
    trace = open_trace(copy, check_later=True)
    pid = os.fork()
    if pid == 0:  # the child (no torch here: the parent's OpenMP threads are not): 0 intact, 1 refused or failed
        try:
            trace.check_intact()
        except BaseException:
            os._exit(1)
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    again = pickle.loads(pickle.dumps(trace))  # (waits for the check: its thread does not travel)
    assert again._checking is None and trace._checking is None and again.workers == trace.workers
    assert files.known_file_fact(copy, CHECKSUM_FACT) is True
