"""One rule for every command's files (arcsim.cli.paths): no output may replace one of the command's inputs.

The tree of commands is walked, not listed: every output option of every command is tried against every other
option and argument that takes text, so an option added later is covered the day it is added."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from conftest import run_cli

from arcsim import files
from arcsim.cli.common import Count, ListOf, Number
from arcsim.cli.main import cli
from arcsim.cli.main import main as arcsim_main
from arcsim.cli.paths import InputPath, JsonTarget, OutputPath, Writes, commands
from arcsim.errors import ArcsimError

OUTPUT_WORDS = {"out", "output", "json", "csv", "plot", "plots", "write", "save", "dest", "report_out"}
SHIPPED_TRACE = files.packaged("traces", "cnn-digits-small.npz")
TOPOLOGY = files.packaged("topologies", "8x8-ib100.yaml")


def invoke(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The real entry point in this process (the check runs before any work, so no work is started)."""
    argv = sys.argv
    sys.argv = ["arcsim", *args]
    try:
        arcsim_main()
        code = 0
    except SystemExit as stop:
        code = int(stop.code or 0)
    finally:
        sys.argv = argv
    return code, capsys.readouterr().err


def takes_text(param: click.Parameter) -> bool:
    return isinstance(param.type, (click.types.StringParamType, click.Path)) and not isinstance(param.type, Writes)


def filler(param: click.Parameter, tmp: Path) -> str:
    """A value that parses for a required parameter that is not under test (and names none of the test's files)."""
    kind = param.type
    if isinstance(kind, click.Choice):
        return str(kind.choices[0])
    if isinstance(kind, (Count, click.types.IntParamType)):
        return "1"
    if isinstance(kind, (Number, click.types.FloatParamType)):
        return "0.5"
    if isinstance(kind, ListOf):
        return "1"
    if isinstance(kind, Writes):
        return str(tmp / "elsewhere" / "new.out")
    if isinstance(kind, InputPath):
        other = tmp / "other-input"
        other.write_text("another input")
        return str(other)
    return "x"


def first_name(patterns: tuple[str, ...] | None) -> str:
    """A file name the patterns match (``validation/*`` → ``validation/x``)."""
    return (patterns or ("x.dat",))[0].replace("*", "x")


def cases() -> Iterator[tuple[tuple[str, ...], click.Command, click.Parameter, click.Parameter]]:
    for words, command in commands(cli):
        for out in command.params:
            if isinstance(out.type, Writes):
                for given in command.params:
                    if takes_text(given):
                        yield words, command, out, given


CASES = list(cases())


def case_id(case: tuple) -> str:
    words, _, out, given = case
    return f"{' '.join(words)}:{out.name}<-{given.name}"


@pytest.mark.parametrize("alias", ["same name", "link", "hard link"])
def test_every_output_option_is_refused_over_every_input_of_its_command(tmp_path: Path, alias: str,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert len(CASES) > 100  # the walk found the tree
    tried = 0
    for n, (words, command, out, given) in enumerate(CASES):
        folder = tmp_path / str(n)
        folder.mkdir()
        out_type = out.type
        assert isinstance(out_type, Writes)
        written = out_type.places("probe")[0].patterns  # a folder output: the names it writes there
        reads_folder = isinstance(given.type, InputPath) and not given.type.file_okay
        if written is not None and reads_folder:
            continue  # folder against folder: covered by the tests below where their names can meet
        if written is not None:
            victim = folder / first_name(written)
            target = folder
        elif reads_folder:
            assert isinstance(given.type, InputPath)
            victim = folder / "in" / first_name(given.type.reads)
            target = victim
        else:
            victim = folder / "input.dat"
            target = victim
        victim.parent.mkdir(parents=True, exist_ok=True)
        victim.write_text("the user's input")
        if alias == "link" and written is None:
            (folder / "alias.dat").symlink_to(victim)
            target = folder / "alias.dat"
        elif alias == "hard link" and written is None:
            (folder / "hard.dat").hardlink_to(victim)
            target = folder / "hard.dat"
        value = str(victim.parent if reads_folder else victim)
        args = [*words]
        for param in command.params:
            if param is out:
                args += [out.opts[0], str(target)] if isinstance(out, click.Option) else [str(target)]
            elif param is given:
                args += [given.opts[0], value] if isinstance(given, click.Option) else [value]
            elif param.required:
                fill = filler(param, folder)
                args += [param.opts[0], fill] if isinstance(param, click.Option) else [fill]
        code, err = invoke(*args, capsys=capsys)
        assert code == 2 and err.count("error:") == 1, (case_id(CASES[n]), args, err)
        assert victim.read_text() == "the user's input", case_id(CASES[n])
        if "would replace" in err:
            tried += 1
        else:  # a name parsed up front (--library) refuses the path as no name it knows, before the check
            assert any(opt in err for opt in given.opts), (case_id(CASES[n]), err)
    assert tried > 100


def test_every_command_checks_and_every_path_option_says_which_way_it_goes() -> None:
    for words, command in commands(cli):
        assert getattr(command.callback, "checks_files", False), words
        for param in command.params:
            if isinstance(param.type, click.Path):
                assert isinstance(param.type, (InputPath, Writes)), (words, param.name)
            named_as_output = set((param.name or "").split("_")) & OUTPUT_WORDS
            if named_as_output and not isinstance(param.type, click.types.BoolParamType):
                assert isinstance(param.type, Writes), (words, param.name)
    assert isinstance(JsonTarget(), Writes) and isinstance(OutputPath(), Writes)


def test_inputs_found_the_way_commands_find_them(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    presets = tmp_path / "presets"
    (presets / "instances").mkdir(parents=True)
    shutil.copy(TOPOLOGY, presets / "mine.yaml")
    instance = presets / "instances" / "mybox.yaml"
    instance.write_text("gpus_per_node: 8\n")
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(SHIPPED_TRACE, traces / "kept.npz")
    monkeypatch.setenv("ARCSIM_TOPOLOGY_PATH", str(presets))
    monkeypatch.setenv("ARCSIM_TRACE_DIR", str(traces))
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"topology: [8x8-ib100, {presets / 'mine.yaml'}]\ntrace: kept.npz\n")
    refused = [
        (("collective", "-t", "mine", "--json", "presets/mine.yaml"), "(--topology)"),  # a preset on the path
        (("collective", "-t", "2xmybox", "--json", str(instance)), "(--topology)"),  # an instance type
        (("trace", "info", "kept.npz", "--json", str(traces / "kept.npz")), "(FILE)"),  # a bare trace name
        (("sweep", str(spec), "--dry-run", "--json", "presets/mine.yaml"), "named in"),  # what a spec names
        (("sweep", str(spec), "--dry-run", "--json", "traces/kept.npz"), "named in"),
        (("topo", "list", "--json", "traces/kept.npz"), "$ARCSIM_TRACE_DIR"),  # the environment's folders
    ]
    for args, who in refused:
        code, err = invoke(*args, capsys=capsys)
        assert code == 2 and err.count("error:") == 1 and who in err, (args, err)
    sweep_dir = tmp_path / "s"
    sweep_dir.mkdir()
    (sweep_dir / "results.csv").write_text("point_id,compressor\n")
    (sweep_dir / "heatmap.png").write_bytes(b"an old chart")
    code, err = invoke("plot", str(sweep_dir), "--json", str(sweep_dir / "results.csv"), capsys=capsys)
    assert code == 2 and "which this command reads (RESULTS)" in err, err
    profile = tmp_path / "charts" / "breakdown.png"  # a folder output over an input with a name it writes
    profile.parent.mkdir()
    profile.write_text("{}")
    code, err = invoke("run", "--compute-profile", str(profile), "--plot", str(profile.parent), capsys=capsys)
    assert code == 2 and "(it writes *.png there)" in err, err
    assert (presets / "mine.yaml").read_bytes() == TOPOLOGY.read_bytes() and profile.read_text() == "{}"


def test_a_write_the_check_could_not_foresee_is_refused_at_the_writer(tmp_path: Path) -> None:
    read = tmp_path / "read.csv"
    read.write_text("a,b\n1,2\n")
    alias = tmp_path / "alias.csv"
    alias.symlink_to(read)
    with files.protecting([read]):
        for write in (lambda: files.write_atomic(alias, "x"),
                      lambda: files.AppendOnlyCSV(read, ["a", "b"]).append([])):
            with pytest.raises(ArcsimError, match="one of this command's inputs"):
                write()
    assert read.read_text() == "a,b\n1,2\n"
    files.write_atomic(alias, "x")  # the command over, the file is the user's to write again
    assert read.read_text() == "x"


def test_a_link_that_loops_is_refused_as_an_output_and_kept(tmp_path: Path) -> None:
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    done = run_cli("topo", "list", "--json", str(loop))
    assert done.returncode == 2 and "symbolic link that leads back to itself" in done.stderr, done.stderr
    assert loop.is_symlink()
    with pytest.raises(ArcsimError, match="leads back to itself"):
        files.write_atomic(loop, "x")
