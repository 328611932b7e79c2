"""The torch-free name lists the command line offers agree with the real registries."""

from __future__ import annotations

import subprocess
import sys

from arcsim import catalog
from arcsim.compressors import NAMES, REGISTRY
from arcsim.datasets import DATASETS
from arcsim.memory import MEMORIES
from arcsim.models import MODELS
from arcsim.synthetic import KINDS


def test_catalog_matches_registries():
    assert catalog.COMPRESSORS == NAMES
    assert tuple(n for n in NAMES if not REGISTRY[n].uses_density) == catalog.DENSITY_FREE
    assert tuple(MEMORIES) == catalog.MEMORIES
    assert catalog.SYNTHETIC_KINDS == KINDS
    assert tuple(MODELS) == catalog.MODELS
    assert tuple(DATASETS) == catalog.DATASETS


def test_network_commands_do_not_import_torch():
    code = ("import sys; from arcsim.cli import cli; "
            "cli.main(['collective', '--json'], standalone_mode=False); assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
