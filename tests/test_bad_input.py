"""Bad input through the real entry point: one `error:` line, exit 2, no traceback, nothing written (issue 13)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from arcsim.files import packaged

BINARY = bytes(range(256)) * 2

CASES = [
    # (arguments, a phrase the error line must hold)
    (["collective", "--seed=-1", "--engine", "des"], "--seed"),
    (["collective", "--size", "0B"], "not positive"),
    (["collective", "--size", "1e30B"], "beyond 1 PB"),
    (["compress", "--synthetic", "normal", "-n", "1e12"], "GiB"),
    (["train", "-w", "1", "--steps", "1"], "at least 2"),
    (["run", "--json", "/proc/x/out.json"], "cannot write /proc/x/out.json"),
    (["run", "--csv", "/proc/x/out.csv"], "cannot write"),
    (["run", "--plot", "/proc/x/plots"], "cannot write"),
    (["sweep", "-o", "/proc/x/sweep", "-b", "10Gbit"], "cannot write"),
    (["plot", "reports", "-o", "/proc/x/plots"], "cannot write"),
    (["train", "-o", "/proc/x/train", "--steps", "1"], "cannot write"),
    (["trace", "capture", "--out", "/proc/x/t.npz"], "cannot write"),
    (["trace", "profile", "--out", "/proc/x/p.json"], "cannot write"),
    (["run", "-t", "{tmp}"], "is a directory"),
    (["run", "-t", "{binary}"], "not a text file"),
    (["trace", "capture", "-w", "1", "--model", "mlp", "--out", "{tmp}/t.npz"], "at least 2"),
    (["sweep", "{empty_axis}", "-o", "{tmp}/sweep"], "axis 'density' has no value"),
    (["device", "predict", "--model", "resnet50", "--gpu", "x100"], "unknown GPU 'x100'; choose one of: a100"),
    (["device", "predict", "--model", "resnet50", "--gpu", "v100", "--precision", "bf16"], "has no bf16"),
    (["device", "predict", "--model", "resnet50", "--gpu", "h100", "--batch", "0"], "at least 1"),
    (["device", "predict", "--model", "resnet50", "--gpu", "cpu"], "measured, not modelled"),
    (["device", "predict", "--model", "alexnet", "--gpu", "h100"], "alexnet"),
    (["device", "show", "tpu"], "unknown GPU 'tpu'"),
    (["run", "--gpu", "x100"], "unknown GPU 'x100'"),
    (["run", "--library", "mpich"], "unknown library 'mpich' for --library; choose one of nccl, gloo, mpi, ideal"),
    (["collective", "--library", "gloo", "--algo", "tree"], "gloo has no tree allreduce (it offers ring, rhd"),
    (["collective", "--op", "broadcast", "--algo", "binomial", "--chunks", "4", "--library", "ideal"],
     "not pipelined"),
    (["collective", "--algo", "tree", "--library", "ideal", "--chunks", "0"], "'--chunks': must be at least 1"),
    (["run", "--params", "0"], "between 1 and 10T"),
    (["run", "--params", "seven"], "not a parameter count"),
    (["run", "--params", "1M", "--trace", "x.npz"], "without --trace"),
    (["run", "--layers", "4"], "--layers goes with --params"),
    (["run", "--fusion", "layer"], "'layer' is not one of"),
    (["run", "--bandwidth", "0Gbit"], "--bandwidth must be positive"),
    (["sweep", "--library", "foo", "-o", "{tmp}/sw"], "unknown library 'foo'"),
    (["sweep", "--fusion", "foo", "-o", "{tmp}/sw"], "unknown fusion 'foo'"),
    (["sweep", "--params", "-5", "-o", "{tmp}/sw"], "not a parameter count"),
    (["train", "--library", "gloo"], "--library prices the steps on a cluster"),
    (["topo", "show", "{lib_yaml}"], "unknown library 'openmpi'"),
    (["run", "--gpu", "v100", "--precision", "bf16"], "has no bf16"),
    (["run", "-t", "8x8-ib100-x100"], "unknown gpu 'x100'"),
    (["run", "--compare-gpu", "h100"], "give --plot DIR"),
    (["run", "--gpu", "h100", "--trace", "cnn-digits-small.npz", "--compute-profile",
      "resnet50-h100-b32-fp32.json"], "does not match trace"),
    (["collective", "-t", "16384x8-ib400", "--algo", "tree", "--engine", "des"], "DES would process about"),
    (["collective", "-t", "16384x8-ib400x8", "--algo", "tree", "--chunks", "64"], "steps hold more than 50 M messages"),
    (["collective", "-t", "16384x8-ib400x8", "--algo", "tree", "--chunks", "64", "--engine", "des"],
     "steps hold more than 50 M messages"),  # too large to build, not only to simulate: said so, as for analytic
    (["train", "--gpu", "h100", "--steps", "1"], "give --topology too"),
    (["train", "--topology", "8x1-eth1", "--gpu", "x100", "--steps", "1"], "unknown GPU 'x100'"),
    (["sweep", "--gpu", "x100", "-o", "{tmp}/sweep"], "unknown GPU 'x100'"),
    (["validate", "--write-config", "{tmp}/cfg", "--calibration-repeats", "3"], "--write-config runs none"),
    (["validate", "--measured", "{tmp}", "--prefix", "mine"], "--measured builds none"),
    (["validate", "--prefix", "my cluster"], "no '-' or spaces"),
    (["calibrate", "--loopback", "-p", "2", "--prefix", "mine", "-o", "{tmp}/l.yaml"], "--loopback builds none"),
    (["calibrate", "--cluster", "emulated", "-p", "2", "-b", "1Gbit", "--prefix", "x/y", "-o", "{tmp}/e.yaml"],
     "no '-' or spaces"),
    (["cluster", "up", "-p", "2", "-b", "1Gbit", "--prefix", "arcsim-rail"], "no '-' or spaces"),
]


# The one case answered after torch loads: it reads both files' layer tables, and the trace reader needs torch.
NEEDS_TORCH = {"does not match trace"}


def _inputs(tmp_path: Path) -> dict[str, Path]:
    """The files CASES' placeholders name, written into ``tmp_path``."""
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(BINARY)
    empty_axis = tmp_path / "sweep.yaml"
    empty_axis.write_text("density:\n")
    lib_yaml = tmp_path / "lib.yaml"
    lib_yaml.write_text(packaged("topologies", "8x1-eth10.yaml").read_text().replace("library: nccl",
                                                                                       "library: openmpi"))
    return {"tmp": tmp_path, "binary": binary, "empty_axis": empty_axis, "lib_yaml": lib_yaml}


@pytest.mark.parametrize(("args", "phrase"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path: Path, args: list[str], phrase: str):
    inputs = _inputs(tmp_path)
    before = sorted(tmp_path.iterdir())
    argv = [a.format(**inputs) for a in args]
    r = run_cli(*argv, cwd=str(tmp_path), timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]
    assert phrase in lines[0], lines[0]
    assert "Traceback" not in r.stderr
    assert sorted(tmp_path.iterdir()) == before  # nothing written


def test_a_writable_output_is_probed_without_leaving_anything(tmp_path: Path):
    from arcsim.files import unwritable_reason

    assert unwritable_reason(tmp_path / "a" / "b" / "out.json", directory=False) is None
    assert unwritable_reason(tmp_path / "new" / "dir", directory=True) is None
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "f").write_text("x")
    assert "is a file" in (unwritable_reason(tmp_path / "f", directory=True) or "")
    assert "not a directory" in (unwritable_reason(tmp_path / "f" / "below.json", directory=False) or "")


BEFORE_TORCH = [  # besides CASES
    (["run", "--density", "2"], "must lie in (0, 1]"),
    (["run", "-c", "zipk"], "zipk"),
    (["run", "--model", "llama_1b"], "what --live trains"),
    (["validate", "--calibration-sizes", "4KB"], "at least two different sizes"),
    (["calibrate", "--loopback", "--ranks", "2", "--sizes", "4KB", "--out", "x.yaml"], "at least two different"),
    (["train", "--model", "alexnet", "--steps", "1"], "unknown model 'alexnet'"),
    (["train", "--model", "cnn", "--model-arg", "width=3", "--steps", "1"], "cnn is a zoo model"),
]


def test_bad_arguments_are_answered_before_torch_is_imported(tmp_path: Path):
    """Issue 51: a typo answered in a quarter of a second, not after torch's import (1.3-2 s). One process with
    torch made unimportable answers every case of CASES (but NEEDS_TORCH's) and BEFORE_TORCH; a case that reached
    an import of torch would fail with that instead."""
    inputs = _inputs(tmp_path)
    cases = [([a.format(**inputs) for a in args], phrase) for args, phrase in CASES if phrase not in NEEDS_TORCH]
    cases += BEFORE_TORCH
    assert len(cases) == len(CASES) - len(NEEDS_TORCH) + len(BEFORE_TORCH)
    script = (
        "import json, sys\n"
        "sys.modules['torch'] = None\n"
        "import click\n"
        "from arcsim.cli.main import cli\n"
        "from arcsim.errors import ArcsimError\n"
        "said = []\n"
        "for args in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        cli.main(args, standalone_mode=False)\n"
        "        said.append('no error')\n"
        "    except (ArcsimError, click.ClickException) as exc:\n"
        "        said.append(exc.format_message() if isinstance(exc, click.ClickException) else str(exc))\n"
        "    except Exception as exc:\n"
        "        said.append(f'{type(exc).__name__}: {exc}')\n"
        "print(json.dumps(said))\n")
    done = subprocess.run([sys.executable, "-c", script, json.dumps([a for a, _ in cases])],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for (args, phrase), message in zip(cases, json.loads(done.stdout), strict=True):
        assert phrase in message, (args, message)
