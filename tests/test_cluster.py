"""The emulated cluster: namespaces, shaping, gloo across them, and tear-down on every exit path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_port, netns_available, run_cli

from arcsim import cluster as cl
from arcsim.cluster import ClusterError, EmulatedCluster, namespaces

HERE = Path(__file__).parent


needs_netns = pytest.mark.skipif(not netns_available(), reason="needs root and network namespaces")


def _leftovers(prefix: str) -> list[str]:
    return namespaces(prefix)


@needs_netns
def test_gloo_all_reduce_across_shaped_namespaces(tmp_path):
    prefix = "arcsimt1"
    with EmulatedCluster(3, "200Mbit", prefix=prefix) as c:
        assert _leftovers(prefix) == [f"{prefix}-br", f"{prefix}-r0", f"{prefix}-r1", f"{prefix}-r2"]
        shaping = c.qdiscs()
        assert shaping.count("tbf") == 6 and shaping.count("rate 200Mbit") == 6  # both directions, every rank
        port = free_port()
        procs = [c.spawn(r, [sys.executable, str(HERE / "_cluster_allreduce.py"), str(tmp_path / "out")], port=port,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(3)]
        for p in procs:
            assert cl.wait_for(p, 120) == 0, p.stdout.read()
    assert _leftovers(prefix) == []
    assert {float((tmp_path / f"out.{r}").read_text()) for r in range(3)} == {6.0}  # 1 + 2 + 3


@needs_netns
def test_exception_and_leftover_processes_are_cleaned_up():
    prefix = "arcsimt2"
    with pytest.raises(RuntimeError, match="boom"), EmulatedCluster(2, "1Gbit", prefix=prefix) as c:
        sleeper = subprocess.Popen(c.command(0, ["sleep", "300"]))
        raise RuntimeError("boom")
    assert _leftovers(prefix) == []
    assert sleeper.wait(timeout=10) != 0  # killed by the tear-down


@needs_netns
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_interrupted_or_killed_owner_leaves_nothing_after_down(how):
    prefix = f"arcsimt3{how.value}"
    proc = subprocess.Popen([sys.executable, str(HERE / "_cluster_victim.py"), prefix], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "up"
    assert len(_leftovers(prefix)) == 3
    os.kill(proc.pid, how)
    proc.wait(timeout=30)
    if how == signal.SIGKILL:  # nothing can run in a SIGKILLed process: `arcsim cluster down` cleans up
        assert len(_leftovers(prefix)) == 3
        r = run_cli("cluster", "down", "--prefix", prefix)
        assert r.returncode == 0 and "removed 3 namespaces" in r.stderr
    assert _leftovers(prefix) == []
    time.sleep(0.2)
    stray = subprocess.run(["pgrep", "-f", "sleep 300"], capture_output=True, text=True).stdout.split()
    assert not [p for p in stray if Path(f"/proc/{p}/ns/net").exists() and
                os.readlink(f"/proc/{p}/ns/net") != os.readlink("/proc/self/ns/net")]


@needs_netns
def test_cli_up_down_and_refusals():
    prefix = "arcsimt4"
    try:
        r = run_cli("cluster", "up", "--ranks", "2", "--bandwidth", "100Mbit", "--prefix", prefix)
        assert r.returncode == 0, r.stderr
        assert run_cli("cluster", "status", "--prefix", prefix).stdout.split() == [f"{prefix}-br", f"{prefix}-r0",
                                                                                 f"{prefix}-r1"]
        again = run_cli("cluster", "up", "--ranks", "2", "--bandwidth", "100Mbit", "--prefix", prefix)
        assert again.returncode == 2 and "already up" in again.stderr
    finally:
        run_cli("cluster", "down", "--prefix", prefix)
    assert _leftovers(prefix) == []


@pytest.mark.parametrize(("args", "fragment"), [
    (("--ranks", "1", "--bandwidth", "1Gbit"), "--ranks must be 2"),
    (("--ranks", "2", "--bandwidth", "fast"), "cannot read bandwidth"),
    (("--ranks", "2", "--bandwidth", "1Gbit", "--delay", "1ms"), "needs netem"),
])
def test_bad_cluster_requests(args, fragment):
    r = run_cli("cluster", "up", *args, "--prefix", "arcsimt5")
    assert r.returncode == 2 and fragment in r.stderr, r.stderr
    assert _leftovers("arcsimt5") == []


def test_refuses_without_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="needs root"):
        cl.check_available()
