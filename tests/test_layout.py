"""The layout the project was specified with: the presets and the default trace have their source in the top-level
topologies/ and traces/, and the build puts them into the wheel as arcsim/data/… (setup.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from arcsim.files import packaged

ROOT = Path(__file__).resolve().parents[1]


def test_a_checkout_reads_the_top_level_folders():
    assert packaged("topologies") == ROOT / "topologies" and packaged("traces") == ROOT / "traces"
    assert packaged("devices") == ROOT / "arcsim" / "data" / "devices"  # the rest stays in the package
    assert not (ROOT / "arcsim" / "data" / "topologies").exists() and not (ROOT / "arcsim" / "data" / "traces").exists()
    assert packaged("examples") == ROOT / "examples" and not (ROOT / "arcsim" / "data" / "examples").exists()


def test_the_wheel_carries_the_top_level_folders_inside_the_package(tmp_path):
    source = tmp_path / "src"  # a copy, so the build writes nothing into the checkout
    for name in ("arcsim", "topologies", "traces", "examples"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "whl"), str(source)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "whl").glob("arcsim-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    presets = sorted((ROOT / "topologies").glob("*.yaml"))
    profiles = sorted((ROOT / "traces" / "profiles").glob("*.json"))
    assert presets and profiles
    assert {f"arcsim/data/topologies/{p.name}" for p in presets} <= names
    assert {f"arcsim/data/traces/profiles/{p.name}" for p in profiles} <= names
    assert "arcsim/data/traces/cnn-digits-small.npz" in names and "arcsim/data/devices/h100.yaml" in names
    examples = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").rglob("*")
                      if p.suffix in (".py", ".yaml"))
    assert "examples/my_model.py" in examples and "examples/topologies/8x1-eth10-straggler.yaml" in examples
    assert {f"arcsim/data/{e}" for e in examples} <= names  # the README's examples, for an installed user
    assert not any(n.startswith(("topologies/", "traces/", "examples/")) for n in names)  # only inside the package
