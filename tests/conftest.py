"""Shared builders for tests."""

from __future__ import annotations

import atexit
import fcntl
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings

try:  # pytest 9 keeps a node's id in ``_id`` (see pytest_collection_modifyitems)
    from _pytest.nodeid import coerce_node_id
except ImportError:  # pytest < 9 reads the suffix xdist writes itself
    coerce_node_id = None

from arcsim.processes import free_port, wait_passively
from arcsim.topology import IntraLink, Network, Topology

# torch's OpenMP threads sleep while they wait, as the `arcsim` entry point has them (arcsim.cli:main, before torch
# loads; run_cli calls its second half in this process): spinning threads on the cores the other xdist workers and
# their ranks share ran tests 4-35 times slower (tests/test_schedule.py's 2 s fixture took 85 s)
wait_passively()

# no test asserts on wall time, hypothesis's per-example deadline (200 ms) included: a first example that loads a
# module or waits on the other worker's load took 0.87 s once, and 0.3 ms again
settings.register_profile("arcsim", deadline=None)
settings.load_profile("arcsim")

# the measurement cache of this test session only (arcsim.run.cache), one per xdist worker so that no test
# sees another's entries: subprocesses inherit it
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if "ARCSIM_CACHE_DIR" not in os.environ or os.environ.get("ARCSIM_TEST_CACHE_OF", _WORKER) != _WORKER:
    os.environ["ARCSIM_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"arcsim-test-cache-{_WORKER or 'main'}-")
    os.environ["ARCSIM_TEST_CACHE_OF"] = _WORKER
    atexit.register(shutil.rmtree, os.environ["ARCSIM_CACHE_DIR"], True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Scheduling for `make test` (``--dist loadgroup``, which sends an xdist group to one worker and hands out the
    largest groups first): the tests that time their own ranks (those holding quiet_cores: the emulated cluster's, a
    loopback calibration) in one group, so no other worker sits waiting on the lock; a module's tests that share one
    of its module-scoped fixtures in a group of the module, so the fixture is built once and not once on each worker
    (test_recording's torchrun jobs were built twice: ~20 s of CPU), and the readers of published_collectives in one
    (else a worker may sit waiting on the other building it); and the tests marked slow before the other
    single tests (xdist hands the groups out first), so none is left running alone at the end."""
    loadgroup = getattr(config.option, "loadgroup", False)
    for item in items:
        names = getattr(item, "fixturenames", ())
        group = ("quiet_cores" if "quiet_cores" in names else SESSION_SHARED if SESSION_SHARED in names
                 else _shared_module_fixture(item))
        if group is None:
            continue
        item.add_marker(pytest.mark.xdist_group(group))
        if coerce_node_id and loadgroup and "@" not in item.nodeid:
            # xdist 3.8 suffixes the group to ``item._nodeid``, which pytest 9 no longer reads (its node ids
            # live in ``_id``): without the suffix the scheduler spread the group and workers sat on the lock
            item._id = coerce_node_id(f"{item.nodeid}@{group}")
    if loadgroup:  # plain runs keep the collected order (quick feedback with -x)
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: otherwise as collected


SESSION_SHARED = "published_collectives"  # a session fixture two modules read: on one worker, no other waits on it


def _shared_module_fixture(item: pytest.Item) -> str | None:
    """The group of the item's module if the item uses a module-scoped fixture its module defines, else None."""
    info = getattr(item, "_fixtureinfo", None)
    module = getattr(item, "module", None)
    if info is None or module is None:
        return None
    own = any(d.scope == "module" and d.func.__module__ == module.__name__
              for name in item.fixturenames for d in info.name2fixturedefs.get(name, ()))
    return module.__name__ if own else None


TEST_CLUSTER_PREFIX = "arcsimtc"  # not arcsim's default: a user's cluster or one a killed run left is not the tests'
# the machine's namespaces are one: so is the lock, whatever a session's TMPDIR (where there is a /tmp)
CLUSTER_LOCK = (Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())) / "arcsim-tests-cluster.lock"


@pytest.fixture
def quiet_cores() -> Iterator[None]:
    """Held by a test that times collectives among its own ranks: one such test at a time across pytest-xdist
    workers (a file lock, for runs without ``--dist loadgroup``, which puts them in one group on one worker). The
    emulated cluster's ranks run real-time (arcsim.testbed.cluster): beside them a loopback calibration failed once
    ("measured times do not grow with size", a clean-clone run, 2026-11-29). Opened read-only: another user's lock
    file serves as well."""
    fd = os.open(CLUSTER_LOCK, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (and the lock with it)


@pytest.fixture
def one_emulated_cluster(quiet_cores: None) -> Iterator[str]:
    """The namespace prefix for a test that builds an emulated cluster (holding ``quiet_cores``: two clusters'
    timings on this machine's cores would each measure the other's load). A cluster found with this prefix is one a
    killed test run left behind (CI failed on such a one, of the default prefix): it is taken down first; one the
    test leaves is an error."""
    from arcsim.testbed.cluster import namespaces, teardown

    teardown(TEST_CLUSTER_PREFIX)
    yield TEST_CLUSTER_PREFIX
    left = namespaces(TEST_CLUSTER_PREFIX)
    teardown(TEST_CLUSTER_PREFIX)
    assert not left, f"the test left an emulated cluster up: {left}"


def flat(p: int, gbps: float = 10.0, latency: float = 20e-6, gamma: float = 0.0, **kw) -> Topology:
    """p single-GPU nodes on one switch: every rank owns its NIC (the textbook setting)."""
    return Topology(name=f"flat{p}", nodes=p, gpus_per_node=1, intra=IntraLink("pcie", 25e9, 3e-6),
                    network=Network("ethernet", 1, gbps * 1e9 / 8, latency), gamma=gamma, **kw)


def multi(nodes: int, gpus: int, nics: int, gbps: float = 100.0, fabric: str = "switch",
          nodes_per_leaf: int = 0, oversubscription: float = 1.0, **kw) -> Topology:
    return Topology(name=f"{nodes}x{gpus}x{nics}", nodes=nodes, gpus_per_node=gpus,
                    intra=IntraLink("nvlink", 300e9, 3e-6),
                    network=Network("infiniband", nics, gbps * 1e9 / 8, 5e-6, fabric, nodes_per_leaf,
                                    oversubscription), **kw)


def run_cli(*args: str, cwd: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 300, process: bool = False) -> subprocess.CompletedProcess:
    """Run arcsim's command line as a user does: its exit code, standard output and standard error. In this test
    process (arcsim.cli.main.main, the entry point's second half: the same errors and exit codes, without a new
    interpreter importing torch for every call) unless ``process`` or ``env`` asks for a process of its own; an
    ``env`` of COLUMNS alone (which every command reads as it starts: arcsim.cli.common.table_width) is set here."""
    if process or (env is not None and not set(env) <= IN_PROCESS_ENV):
        return subprocess.run([sys.executable, "-m", "arcsim", *args], capture_output=True, text=True, cwd=cwd,
                              env=None if env is None else {**os.environ, **env}, timeout=timeout)
    return _run_in_process(list(args), cwd, env or {})


IN_PROCESS_ENV = {"COLUMNS"}  # variables run_cli sets in this process rather than spawning one


def _run_in_process(args: list[str], cwd: str | None, env: dict[str, str]) -> subprocess.CompletedProcess:
    import contextlib
    import io
    import traceback

    from arcsim.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    here, argv = os.getcwd(), sys.argv
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    code: int = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if cwd is not None:
                os.chdir(cwd)
            sys.argv = ["arcsim", *args]
            try:
                main()
            except SystemExit as exc:
                if isinstance(exc.code, int) or exc.code is None:
                    code = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    code = 1
            except Exception:  # as an interpreter would: the traceback, exit 1
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(here)
        sys.argv = argv
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return subprocess.CompletedProcess(["arcsim", *args], code, out.getvalue(), err.getvalue())


def interruptible() -> None:
    """Popen's preexec_fn for a child a test will SIGINT: a shell's `&` (or a pytest-xdist worker) starts us with
    SIGINT ignored, which children inherit and Python then keeps; the default lets Python raise KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# what the tests' rank scripts import: once, by the forkserver
RANK_SCRIPTS_IMPORT = ["torch.nn.parallel", "torch.distributed.fsdp", "arcsim.hooks", "arcsim.compressors.registry",
                       "arcsim.compressors.memory", "arcsim.comm.distributed", "arcsim.models",
                       "arcsim.traces.synthetic", "arcsim.sharding.fsdp_probe"]


def spawn_ranks(script: Path, world: int, out_dir: Path, timeout: float = 600) -> None:
    """Run ``script RANK WORLD PORT OUT_DIR`` as ``world`` gloo processes on loopback, forked from a server that
    imported torch once (arcsim.testbed.ranks); fail with a failing rank's output."""
    from arcsim.processes import forkserver
    from arcsim.testbed.ranks import RankLaunch, run_ranks

    forkserver(RANK_SCRIPTS_IMPORT)
    port = free_port()
    run_ranks([RankLaunch(str(script), (str(r), str(world), str(port), str(out_dir)), dict(os.environ), script=True)
               for r in range(world)], timeout)


def loopback_job(target: str | Path, args: list[str], nproc: int, script: bool = False, timeout: float = 300) -> None:
    """``target`` (a module, or a script's path where ``script``) as ``nproc`` ranks on loopback as torchrun starts
    them (arcsim.testbed.ranks.on_loopback), forked from a server that imported torch once: for tests whose point is
    the job, not its launcher (each torchrun started nproc + 1 interpreters importing torch; tests/test_recording.py
    and tests/test_validate.py keep torchrun jobs of their own)."""
    from arcsim.processes import forkserver
    from arcsim.testbed.ranks import on_loopback, run_ranks

    forkserver(RANK_SCRIPTS_IMPORT)
    run_ranks(on_loopback(str(target), args, nproc, script=script), timeout)


def rank_reports(script: Path, world: int, out_dir: Path) -> list[dict]:
    """Run ``script`` as ``world`` gloo ranks (spawn_ranks) and read the rankN.json each one wrote."""
    import json

    spawn_ranks(script, world, out_dir)
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def benchmark(name: str) -> ModuleType:
    """A script of benchmarks/ imported as a module (registered first: its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / "benchmarks" /
                                                  f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def once_per_session(name: str, compute: Callable[[], object], tmp_path_factory: pytest.TempPathFactory) -> object:
    """``compute()`` (JSON-able) once for this test session, whichever pytest-xdist workers ask: the first writes it
    under a lock to the temp folder the session's workers share, the others read it (without xdist: computed)."""
    import json

    if not _WORKER:
        return compute()
    shared = tmp_path_factory.getbasetemp().parent  # pytest-N/, above every worker's popen-gwK/
    path = shared / f"{name}.json"
    with open(shared / f"{name}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            if not path.exists():
                path.write_text(json.dumps(compute()))
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def published_collectives(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """benchmarks/published_collectives.py run once for the session (~20 s of CPU; two test files read it):
    ``report`` (its held-out table) and ``fit`` (the constants fitted on every source)."""
    def compute() -> dict:
        pub = benchmark("published_collectives")
        return {"report": pub.report(show_rows=False), "fit": pub.fit(pub.rows())}

    result = once_per_session("published_collectives", compute, tmp_path_factory)
    assert isinstance(result, dict)
    return result


def netns_available() -> bool:
    """Whether this machine can build the emulated cluster (root, iproute2, network namespaces)."""
    from arcsim.testbed.cluster import ClusterError, check_available

    try:
        check_available()
    except ClusterError:
        return False
    return True
