"""The layers of arcsim, declared once: which package may import which, read from the code with ast.

A package imports only packages of its own tier or below it, and within a tier only those listed before it
(test_layers.py holds every import to it, module-level, in functions and under TYPE_CHECKING, and finds no
cycle among the modules' run-time imports). ``python tests/layers.py`` prints the package and module map of
docs/architecture.md, each module by its docstring's first sentence; ``--write`` puts it there. It lives
beside the tests, not in the package: nothing arcsim runs needs it.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "arcsim"  # the package

# (tier, why it sits there, its packages bottom first): a package is a top-level module or subpackage of arcsim,
# "arcsim" the package's own __init__ and "__main__" `python -m arcsim`.
LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("base", "what every layer shares and none decides: errors, SI units, the one writer and cache, torch-free "
             "names (catalog), chart helpers",
     ("errors", "units", "files", "processes", "arcsim", "catalog", "plotting")),
    ("gradients", "real tensors, no network: the model zoo and its counted workload, the Communicator seam and its "
                  "CommLog, the compressors that call it, traces of their gradients, and the device model that "
                  "times a step from a model's workload and a trace's profile",
     ("models", "comm", "compressors", "traces", "devices")),
    ("network", "the cluster and a collective's cost on it: the topology (naming its GPU from devices), its phases "
                "by step, each algorithm's steps and each library's choice, the engines, pricing of a CommLog",
     ("topology", "network_schedule", "collectives", "netsim", "pricing")),
    ("strategy", "one step of a parallel strategy (DDP, Horovod, FSDP, HSDP, ZeRO++) on the one timeline engine, "
                 "with the cluster's effects, memory per GPU and a bucket plan run writes and the hooks run",
     ("strategy",)),
    ("run", "`arcsim run`: measure compressors on a trace's buckets, price, decide, report", ("run",)),
    ("applications", "what builds on run: DDP comm hooks, training, sweeps, the testbed's real runs (with the hooks), "
                     "and `arcsim shard` (priced by run, measured on the testbed)",
     ("hooks", "train", "sweep", "testbed", "sharding")),
    ("cli", "the command line, thin: parse, call the library, render", ("cli", "__main__")),
)

# Imports that still climb, each waiting for its move: (importer, imported) → where it goes. None now.
PENDING: dict[tuple[str, str], str] = {}

RANK = {pkg: i for i, pkg in enumerate(p for _, _, pkgs in LAYERS for p in pkgs)}


@dataclass(frozen=True)
class Import:
    """One import of an arcsim module by another: where it stands and how it runs."""

    src: str
    dst: str
    line: int
    kind: str  # "module" (at import time), "function" (when called) or "type" (under TYPE_CHECKING, never)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def package_of(module: str) -> str:
    """The layer entry a module belongs to: arcsim's top-level module or subpackage it sits in."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _targets(node: ast.Import | ast.ImportFrom, src: str, is_pkg: bool, known: dict[str, Path]) -> list[str]:
    """The arcsim modules an import statement names (``from a import b``: the module a.b where there is one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "arcsim"]
    base = node.module or ""
    if node.level:
        here = src.split(".") if is_pkg else src.split(".")[:-1]
        base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
    if base.split(".")[0] != "arcsim":
        return []
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def imports(root: Path = ROOT) -> list[Import]:
    """Every import of an arcsim module in the package, with its kind."""
    known = modules(root)
    out: list[Import] = []
    for src, path in known.items():
        is_pkg = path.name == "__init__.py"

        def walk(nodes: list[ast.AST], kind: str, src: str = src, is_pkg: bool = is_pkg) -> None:
            for node in nodes:
                if isinstance(node, ast.Import | ast.ImportFrom):
                    out.extend(Import(src, dst, node.lineno, kind) for dst in _targets(node, src, is_pkg, known))
                elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                    walk(list(node.body), "type")
                    walk(list(node.orelse), kind)
                else:
                    inner = "function" if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else kind
                    walk(list(ast.iter_child_nodes(node)), inner)

        walk([ast.parse(path.read_text(encoding="utf-8"))], "module")
    return out


def climbing(found: list[Import]) -> list[Import]:
    """The imports from a package to one declared above it (an undeclared package climbs everywhere)."""
    top = len(RANK)
    return [i for i in found if package_of(i.src) != package_of(i.dst)
            and RANK.get(package_of(i.src), -1) < RANK.get(package_of(i.dst), top)]


def cycles(found: list[Import]) -> list[list[str]]:
    """The groups of modules that import each other at run time (module level or in functions), each sorted."""
    graph: dict[str, set[str]] = {}
    for i in found:
        if i.kind != "type" and i.src != i.dst:
            graph.setdefault(i.src, set()).add(i.dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def summary(path: Path) -> str:
    """A module's docstring up to its first sentence's end, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    end = re.search(r"(?<!e\.g)(?<!i\.e)(?<! al)\.(\s|$)", text)
    return text[:end.start() + 1] if end else text


BEGIN = "<!-- layers: generated by `python tests/layers.py --write`; edit the code, not this -->"
END = "<!-- /layers -->"


def markdown(root: Path = ROOT) -> str:
    """The tiers, bottom first, each with its packages and their modules, as docs/architecture.md shows them."""
    known = modules(root)
    lines = [BEGIN]
    for tier, why, pkgs in LAYERS:
        lines += ["", f"**{tier}**: {why}.", ""]
        for m in sorted((m for m in known if package_of(m) in pkgs), key=lambda m: (pkgs.index(package_of(m)), m)):
            parts = known[m].relative_to(root.parent).parts
            shown = "/".join(parts[:-1]) + "/" if parts[-1] == "__init__.py" else "/".join(parts)
            lines.append(f"{'  ' * (len(parts) - 2 - (parts[-1] == '__init__.py'))}- `{shown}`: {summary(known[m])}")
    return "\n".join([*lines, "", END]) + "\n"


def write(doc: Path) -> None:
    """Replace the generated section of ``doc`` with :func:`markdown`."""
    text = doc.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END + "\n")
    doc.write_text(head + markdown() + tail, encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write(ROOT.parent / "docs" / "architecture.md")
    else:
        sys.stdout.write(markdown())
