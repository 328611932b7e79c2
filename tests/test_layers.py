"""The house follows (issue 49): no import climbs back up the layers tests/layers.py declares, no cycle among the
modules, and docs/architecture.md's module map is the one the code gives."""

from __future__ import annotations

from pathlib import Path

import layers
from layers import LAYERS, PENDING, RANK, Import, climbing, cycles, imports, markdown, package_of

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
FOUND = imports()


def test_every_package_has_one_place_in_the_layers():
    names = [p for _, _, pkgs in LAYERS for p in pkgs]
    assert len(names) == len(set(names))
    assert {package_of(m) for m in layers.modules()} == set(RANK)


def test_no_import_climbs_back_up():
    climbs = {(i.src, i.dst): i for i in climbing(FOUND)}
    assert [i for pair, i in climbs.items() if pair not in PENDING] == []
    assert [pair for pair in PENDING if pair not in climbs] == []  # a mended one leaves the list


def test_no_cycle_among_the_modules():
    assert cycles([i for i in FOUND if (i.src, i.dst) not in PENDING]) == []


def test_the_checks_see_imports_in_functions_relative_and_under_type_checking(tmp_path):
    pkg = tmp_path / "arcsim"
    (pkg / "run").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("def f():\n    from arcsim import run\n")
    (pkg / "run" / "__init__.py").write_text("")
    (pkg / "run" / "a.py").write_text("from . import b\n")
    (pkg / "run" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n"
                                      "from ..errors import f\n")
    found = set(imports(pkg))
    assert found == {Import("arcsim.errors", "arcsim.run", 2, "function"),
                     Import("arcsim.run.a", "arcsim.run.b", 1, "module"),
                     Import("arcsim.run.b", "arcsim.run.a", 3, "type"),
                     Import("arcsim.run.b", "arcsim.errors", 4, "module")}
    assert climbing(list(found)) == [Import("arcsim.errors", "arcsim.run", 2, "function")]
    assert cycles(list(found)) == []  # a.b ↔ b.a only by a type: never run
    assert cycles([*found, Import("arcsim.run.b", "arcsim.run.a", 9, "function")]) == [["arcsim.run.a",
                                                                                        "arcsim.run.b"]]


def test_docs_architecture_shows_the_layers_and_modules_the_code_has():
    text = DOC.read_text(encoding="utf-8")
    start = text.index(layers.BEGIN)
    assert text[start:text.index(layers.END) + len(layers.END) + 1] == markdown(), \
        "run `python tests/layers.py --write`"
