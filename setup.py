"""The build's one addition to pyproject.toml: the top-level source folders of the shipped data (``topologies/``:
the preset YAMLs; ``traces/``: the default trace and the measured profiles; ``examples/``: the README's examples)
go into the wheel as ``arcsim/data/topologies``, ``arcsim/data/traces`` and ``arcsim/data/examples``, where
:func:`arcsim.files.packaged` reads them (`arcsim examples` prints where the examples are). An editable install
reads them where they are."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

# what ships from each folder (not everything in it: traces/ is also where a user may capture their own);
# the default trace's name is arcsim.traces.resolve.DEFAULT_TRACE_NAME
SHIPPED = {"topologies": ("*.yaml", "instances/*.yaml"), "traces": ("cnn-digits-small.npz", "profiles/*.json"),
           "examples": ("*.py", "*.yaml", "topologies/*.yaml", "nccl-tests/*.log")}


class BuildPyWithData(build_py):
    """build_py, then the shipped files of the top-level data folders into arcsim/data/ of the build."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        root = Path(__file__).resolve().parent
        for folder, patterns in SHIPPED.items():
            files = sorted(p for pattern in patterns for p in (root / folder).glob(pattern))
            if not files:
                raise SystemExit(f"setup.py: nothing to ship in {root / folder}")
            for src in files:
                dest = Path(self.build_lib, "arcsim", "data", src.relative_to(root))
                self.mkpath(str(dest.parent))
                self.copy_file(str(src), str(dest))


setup(cmdclass={"build_py": BuildPyWithData})
