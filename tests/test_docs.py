"""Every console example in README.md and docs/*.md is parsed by the real command line, and run unless it
needs what CI lacks (root, a GPU, a real cluster) or minutes of CPU; each of those is named here with why.
Set ARCSIM_DOCTEST_ALL=1 to run the slow ones too. Relative links in the docs must point at real files."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from conftest import free_port

from arcsim.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Substring of the example → why the suite parses it but does not run it. Every entry must match an example.
NOT_RUN = {
    "--device cuda": "needs a CUDA GPU",
    "--scheduler tcp://head": "needs a Dask cluster",
    "--measured val/": "needs results measured on a real cluster",
    "--report reports/validation.csv": "reads the checkout's committed validation; tests/test_validate.py runs it",
    "torchrun --nnodes 8": "needs a real 8-node cluster",
    "torchrun --nnodes 4": "needs a real cluster of 4 nodes × 8 GPUs",
    "resnet50.npz": "captures ResNet-50 (33–70 s) and analyses it (~80 s) on 2 cores",
    "resnet18.npz": "captures ResNet-18 first (~40 s on 2 cores)",
    "capture --model resnet18": "captures ResNet-18 (~40 s on 2 cores)",
    "reports/sweeps/r18": "reads the ResNet-18 sweep above",
    "arcsim train": "trains for 30 s to minutes; tests/test_train.py runs the same paths on fewer steps",
    "topologies/emu4-100m.yaml": "reads the emulated cluster's calibration (root)",
    "--model llama_60m": "captures LLaMA-60M (about a minute on 2 cores); tests/test_llama_text.py checks the model",
    "width=64 --dataset python-text --seq-len 64": "trains your GPT live (~30 s on 2 cores); tests/test_strategy.py "
                                                   "runs it smaller",
    "--ranks-per-node 2 --sizes 256KB,2MB,8MB --out topologies/loop2x2.yaml":
        "tests/test_calibrate.py runs this calibration (with 2 repeats) and checks the groups it writes",
    "llama1b.npz": "captures LLaMA-1B (70 s, 17.5 GB) and prices it (7 min on 2 cores); tests/test_strategy.py runs "
                   "--sharding on the shipped trace",
}
SLOW = ("resnet50.npz", "resnet18.npz", "capture --model resnet18", "reports/sweeps/r18", "arcsim train",
        "--model llama_60m", "width=64 --dataset python-text --seq-len 64", "llama1b.npz")


@dataclass(frozen=True)
class Example:
    doc: str
    line: str       # as written, without the prompt
    root: bool      # shown with a '#' prompt: run as root

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.line, comments=True)

    def __str__(self) -> str:
        return f"{self.doc}: {self.line}"


def examples() -> list[Example]:
    found = []
    for path in DOCS:
        for block in re.findall(r"```(?:console|bash)\n(.*?)```", path.read_text(), re.S):
            lines = iter(block.splitlines())
            for line in lines:
                if not line.startswith(("$ ", "# ")):
                    continue
                text = line[2:]
                while text.rstrip().endswith("\\"):
                    text = text.rstrip()[:-1] + " " + next(lines).strip()
                if shlex.split(text, comments=True)[:1] in (["arcsim"], ["torchrun"], ["make"], ["ip"]):
                    found.append(Example(path.name, text, line.startswith("# ")))
    return found


def is_arcsim(example: Example) -> bool:
    argv = example.argv
    return argv[0] == "arcsim" or (argv[0] == "torchrun" and "-m" in argv and argv[argv.index("-m") + 1] == "arcsim")


EXAMPLES = examples()
ARCSIM = [e for e in EXAMPLES if is_arcsim(e)]


def why_not_run(example: Example) -> str | None:
    if example.root:
        return "needs root (network namespaces)"
    if example.argv[0] in ("make", "ip"):
        return "set-up and namespace commands, run by CI itself / by root"
    for key, reason in NOT_RUN.items():
        if key in example.line and not (os.environ.get("ARCSIM_DOCTEST_ALL") and key in SLOW):
            return reason
    return None


def cli_args(example: Example) -> list[str]:
    argv = example.argv
    return argv[argv.index("-m") + 2:] if argv[0] == "torchrun" else argv[1:]


def parse(args: list[str]) -> click.Context:
    """Parse ``args`` down to the leaf command, checking every option, choice and type as a real call would."""
    command: click.Command = cli
    ctx: click.Context | None = None
    while isinstance(command, click.Group):
        name_at = next(i for i, a in enumerate(args) if not a.startswith("-"))
        ctx = command.make_context(command.name or "arcsim", args[:name_at], parent=ctx, resilient_parsing=True)
        sub = command.get_command(ctx, args[name_at])
        assert sub is not None, f"no command {args[name_at]!r}"
        command, args = sub, args[name_at + 1:]
    return command.make_context(command.name or "", args, parent=ctx)


def test_the_docs_have_examples_and_every_exception_is_used() -> None:
    assert len(ARCSIM) >= 40
    for key in NOT_RUN:
        assert any(key in e.line for e in EXAMPLES), f"NOT_RUN entry {key!r} matches no example any more"


@pytest.mark.parametrize("example", ARCSIM, ids=str)
def test_every_arcsim_example_parses(example: Example, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # output paths are checked for writability: check them in a scratch place
    parse(cli_args(example))


def workspace(tmp: Path) -> Path:
    """A user's folder holding the examples (shipped data comes from the installed package, as for a user)."""
    shutil.copytree(ROOT / "examples", tmp / "examples")
    return tmp


def first_documents() -> dict[str, set[str]]:
    """Per document, the example lines an earlier document already has word for word (run once, there)."""
    seen: set[str] = set()
    later: dict[str, set[str]] = {}
    for e in EXAMPLES:
        key = " ".join(e.argv)
        if key in seen:
            later.setdefault(e.doc, set()).add(e.line)
        seen.add(key)
    return later


RUN_ELSEWHERE = first_documents()


TIMING_RANKS = {"calibration.md"}  # documents whose examples time collectives among their own ranks (loopback)


@pytest.mark.slow
@pytest.mark.parametrize("doc", sorted({e.doc for e in EXAMPLES} - TIMING_RANKS))
def test_runnable_examples_run(doc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each document's examples in order, in one scratch directory (later ones may read what earlier wrote);
    arcsim itself in this process (as the console script calls it), torchrun as a subprocess."""
    run_examples(doc, tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("doc", sorted(TIMING_RANKS))
def test_runnable_examples_that_time_their_ranks_run(doc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     quiet_cores: None) -> None:
    """As test_runnable_examples_run, never beside the emulated cluster's real-time ranks."""
    run_examples(doc, tmp_path, monkeypatch)


def run_examples(doc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workspace(tmp_path))
    ran = 0
    for example in (e for e in EXAMPLES if e.doc == doc):
        if why_not_run(example) or example.line in RUN_ELSEWHERE.get(doc, ()):
            continue
        argv = example.argv
        if argv[0] == "arcsim":
            result = CliRunner().invoke(cli, argv[1:], env={"COLUMNS": "100"})
            assert result.exit_code == 0 and result.exception is None, f"{example}\n{result.output[-2000:]}"
        else:
            port = ["--master_port", str(free_port())]  # not torchrun's fixed default: other tests may hold it
            done = subprocess.run([sys.executable, "-m", "torch.distributed.run", *port, *argv[1:]],
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"{example}\n{done.stderr[-2000:]}"
        ran += 1
    if ran == 0:
        pytest.skip(f"every example in {doc} needs root, a GPU, a cluster or minutes")


def test_relative_links_in_the_docs_point_at_files() -> None:
    missing = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" not in target and not (path.parent / target).exists():
                missing.append(f"{path.name}: {target}")
    assert not missing, missing


def test_shell_completion_script_is_produced() -> None:
    script = Path(sys.executable).parent / "arcsim"  # the installed entry point: completion keys on its name
    done = subprocess.run([str(script)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "_ARCSIM_COMPLETE": "bash_source"})
    assert "complete" in done.stdout and "_ARCSIM_COMPLETE" in done.stdout, done.stdout + done.stderr


def test_the_python_api_example_runs_from_a_users_folder(tmp_path: Path) -> None:
    """docs/python-api.md's script, run as a user would (another folder): each step's error and time."""
    (block,) = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "python-api.md").read_text(), re.S)
    script = tmp_path / "price.py"
    script.write_text(block)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 16 and all(re.match(r"step \d+: relative error 0\.\d{3}, 1 collectives, \d+ us$", ln)
                                    for ln in lines), done.stdout
    assert sorted(tmp_path.iterdir()) == [script]
