"""The torch-free name lists the command line offers agree with the real registries."""

from __future__ import annotations

import subprocess
import sys

from arcsim import catalog
from arcsim.compressors.memory import MEMORIES
from arcsim.compressors.registry import NAMES, REGISTRY
from arcsim.models import MODELS
from arcsim.models.datasets import DATASETS
from arcsim.traces.synthetic import KINDS


def test_catalog_matches_registries():
    assert catalog.COMPRESSORS == NAMES
    assert tuple(MEMORIES) == catalog.MEMORIES
    assert catalog.SYNTHETIC_KINDS == KINDS
    assert tuple(MODELS) == catalog.MODELS
    assert tuple(DATASETS) == catalog.DATASETS


def test_each_descriptor_matches_its_compressor_class():
    """One descriptor per compressor: its options are exactly the constructor's keywords, and its family
    is how the compressor really moves values (all-gather or not) on a tiny run."""
    import inspect

    import torch

    from arcsim.comm.inprocess import InProcessComm

    for name, cls in REGISTRY.items():
        info = catalog.INFO[name]
        params = set(inspect.signature(cls.__init__).parameters) - {"self", "density", "seed", "inner_options"}
        accepted = set(info.options) - ({"scope", "rank"} if name == "adaptive" else set())
        assert params == accepted, (name, params, info.options)
        comm = InProcessComm(2)
        REGISTRY[name](0.25).compress(torch.randn(2, 64), comm, 1)
        gathers_values = any(r.op == "allgather" and "values" in r.tag for r in comm.log.records)
        assert gathers_values == (info.family == "all-gather"), name


def test_network_commands_do_not_import_torch():
    code = ("import sys; from arcsim.cli import cli; "
            "cli.main(['collective', '--json', '-'], standalone_mode=False); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_package_layout_and_entry_point_module_names():
    """At most 12 modules directly under arcsim/ (the layers are packages), and every module another
    process runs with `python -m` exists under the name the code passes."""
    import importlib.util
    from pathlib import Path

    from arcsim import testbed

    root = Path(catalog.__file__).parent
    assert len(list(root.glob("*.py"))) <= 12
    for name in (testbed.VALIDATE_WORKER, testbed.DELAY_FORWARDER, testbed.MICROBENCH):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        assert 'if __name__ == "__main__":' in Path(spec.origin).read_text(), name
