"""Write the byte-code of what arcsim and its test suite import, in this one process (make's set-up).

pip installs without byte-compiling (half of making the venv: it compiles every file of every package), and this
compiles what the suite's processes import: where PYTHONDONTWRITEBYTECODE is set, as on CI, each of its ~200
processes would otherwise compile torch and the rest again (torch's import 3.9 s against 1.7 s)."""

from __future__ import annotations

import sys

sys.dont_write_bytecode = False  # before any import below: this process writes what it imports

import importlib  # noqa: E402
import pkgutil  # noqa: E402

# imported inside functions (so not reached by importing arcsim's modules), but by the suite's processes
LAZY = ("torch.distributed", "torch.distributed.fsdp", "torch.distributed.run", "torch._dynamo", "torch.testing",
        "matplotlib.pyplot", "pandas", "scipy.optimize", "scipy.stats", "simpy", "dask", "dask.distributed",
        "pymoo.algorithms.moo.nsga2", "pymoo.optimize", "transformers", "tokenizers", "hypothesis", "pytest",
        "xdist.plugin", "xdist.remote", "execnet", "yaml", "rich.table", "click.testing")


def main() -> None:
    import arcsim

    names = [m.name for m in pkgutil.walk_packages(arcsim.__path__, "arcsim.", onerror=lambda _: None)
             if not m.name.endswith("__main__")]
    failed = []
    for name in (*LAZY, *names):
        try:
            importlib.import_module(name)
        except Exception as exc:  # an optional package missing: nothing to compile for it
            failed.append(f"{name} ({type(exc).__name__})")
    print(f"byte-code written for what {len(LAZY) + len(names) - len(failed)} modules import"
          + (f"; not importable here: {', '.join(failed)}" if failed else ""))


if __name__ == "__main__":
    main()
