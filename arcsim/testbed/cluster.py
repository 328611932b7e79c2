"""An emulated cluster on one machine: one network namespace per rank, a bridge, and tbf rate shaping.

    with EmulatedCluster(ranks=4, bandwidth="1Gbit") as cluster:
        cluster.run("worker.py", [], timeout=600, script=True)  # or Popen each: cluster.spawn(rank, argv)

Layout: namespace ``<prefix>-br`` holds a Linux bridge; namespace ``<prefix>-r<i>`` holds node i's end of
a veth pair (``eth0``, address 10.77.0.<i+1>/24, used only inside these namespaces). Both directions
are shaped with a token bucket (tbf): on the node's ``eth0`` (what it sends) and on its bridge port
(what it receives). A node holds one rank, or ``ranks_per_node`` of them: ranks of one node share its
namespace and reach each other over loopback (unshaped, as GPUs of a node reach each other over NVLink or
PCIe), and share its ``eth0`` — one NIC — to the other nodes; ranks are numbered node by node. Ranks run
under real-time priority (``chrt -f 1``) where allowed: on two cores the default scheduler adds
milliseconds of jitter to small collectives.

Tear-down removes every namespace with the prefix (which deletes the veths and bridge) after killing
every process inside — on success, on exceptions, on Ctrl-C or SIGTERM, and from ``arcsim cluster down``
after a crash.

With a one-way ``delay`` (netem is missing from this kernel) the bridge is replaced by a user-space link:
the hub namespace runs ``arcsim.testbed.delay_forwarder``, which owns one TUN device per rank, moved into the
rank's namespace as ``eth0`` (MTU 65000 so that the forwarder keeps up). The rank's tbf shapes what it
sends; the forwarder holds each packet for the delay and serialises it at the receiver's rate. Ranks then
run without real-time priority: packets written into a TUN device are finished by the kernel's softirq
thread, which real-time ranks on every core starve (measured: a 2-rank validation went from 12.6 % to
60.3 % MAPE, with 200–300 ms stalls, when the ranks were real-time).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import TracebackType

from arcsim.errors import ArcsimError
from arcsim.processes import signals_interrupt
from arcsim.testbed import DELAY_FORWARDER
from arcsim.topology import splits_into_nodes
from arcsim.units import parse_duration, parse_rate

PREFIX = "arcsim"
SUBNET = "10.77.0"
MTU = 1500
TUN_MTU = 65000  # the forwarder handles one packet per 65 kB instead of per 1.5 kB
TEARDOWN_SCANS = 100  # tear-down: scans of /proc at most (20 ms apart) until two in a row find no process left


class ClusterError(ArcsimError):
    """The emulated cluster cannot be built here, or was asked for something impossible."""


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["netns", "exec", ns, "ip"] if ns else []), *args]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed: {out.stderr.strip() or out.stdout.strip()}")
    return out


def _tc(ns: str, *args: str) -> None:
    out = subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise ClusterError(f"tc {' '.join(args)} in {ns} failed: {out.stderr.strip()}")


PREFIX_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.]{0,31}")  # a file name under /run/netns, no "-": see below


def check_prefix(prefix: str) -> None:
    """Refuse a prefix that is no plain name (a namespace is a file under /run/netns; ``-`` ends the prefix in
    ``<prefix>-br`` and ``<prefix>-r<i>``, so that no cluster's names are another's)."""
    if not PREFIX_PATTERN.fullmatch(prefix):
        raise ClusterError(f"--prefix {prefix!r}: give 1 to 32 letters, digits, '_' or '.' (no '-' or spaces), "
                           "starting with a letter or digit, e.g. arcsim2")


def namespaces(prefix: str = PREFIX) -> list[str]:
    """Existing namespaces that belong to an emulated cluster with this prefix: ``<prefix>-br`` and
    ``<prefix>-r<i>``, not another prefix's that begins with this one."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    names = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    mine = re.compile(rf"{re.escape(prefix)}-(br|r\d+)")
    return sorted(n for n in names if mine.fullmatch(n))


def refuse_if_up(prefix: str = PREFIX) -> None:
    """Refuse to build a cluster over one with the same prefix (commands that measure call it before their long work
    as well: one left by a killed run would otherwise stop them after it)."""
    if namespaces(prefix):
        down = "arcsim cluster down" + ("" if prefix == PREFIX else f" --prefix {prefix}")
        raise ClusterError(f"an emulated cluster with prefix {prefix!r} is already up; run `{down}` first (or "
                           "give this one another --prefix)")


def _entering(ns: str) -> list[int]:
    """Processes still in ``ip netns exec <ns>``, not yet inside: `ip netns pids` misses them, and once in
    they would outlive the namespace's name (a rank started just before an exception, say)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry.name}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:4] == [b"ip", b"netns", b"exec", ns.encode()]:
                    found.append(int(entry.name))
    return found


def _hold(ns: str) -> int | None:
    """An open descriptor of the network namespace ``ns`` names (None: gone): while it is open the namespace lives
    on, name deleted or not, and its inode — what its processes' /proc/<pid>/ns/net links show — is no other's."""
    try:
        return os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    except OSError:
        return None


def _inside(inodes: set[int]) -> list[int]:
    """Processes whose network namespace is one of ``inodes``, whatever its name (or none left)."""
    wanted = {f"net:[{i}]" for i in inodes}
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry.name}/ns/net") in wanted:
                    found.append(int(entry.name))
    return found


def teardown(prefix: str = PREFIX) -> list[str]:
    """Kill every process in (or entering) the prefix's namespaces and delete them; returns what was removed.

    The namespaces are noted by inode, their names deleted (so no new process can enter by name), then every
    process still entering or inside one is killed, scan after scan, until two scans in a row find none: a child
    forked but not yet `ip`, or one a concurrent `arcsim cluster down` started, is caught once it is in."""
    removed = namespaces(prefix)
    held = [fd for ns in removed if (fd := _hold(ns)) is not None]  # alive, so no new namespace takes its inode
    try:
        inodes = {os.fstat(fd).st_ino for fd in held}
        for ns in removed:
            for pid in _entering(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for ns in removed:
            _ip("netns", "del", ns, check=False)
        quiet = 0
        for _ in range(TEARDOWN_SCANS):
            left = _inside(inodes) + [pid for ns in removed for pid in _entering(ns)]
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            quiet = 0 if left else quiet + 1
            if quiet == 2:
                break
            time.sleep(0.02)
        else:
            print(f"warning: processes {left} were still in {prefix}'s namespaces after {TEARDOWN_SCANS} scans",
                  file=sys.stderr)
    finally:
        for fd in held:
            os.close(fd)
    return removed


@functools.cache
def realtime_allowed() -> bool:
    """Whether `chrt -f 1` works here (some sandboxes forbid real-time scheduling); ranks run without it if not."""
    if shutil.which("chrt") is None:
        return False
    return subprocess.run(["chrt", "-f", "1", "true"], capture_output=True).returncode == 0


def check_available() -> None:
    """Refuse clearly when this machine cannot build namespaces."""
    if os.geteuid() != 0:
        raise ClusterError("the emulated cluster needs root (network namespaces and tc); run as root or use "
                           "--loopback")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ClusterError(f"the emulated cluster needs `{tool}` (iproute2); install it or use --loopback")
    probe = f"{PREFIX}-probe-{os.getpid()}"
    out = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if out.returncode != 0:
        raise ClusterError(f"network namespaces are unavailable here ({out.stderr.strip()}); use --loopback")
    _ip("netns", "del", probe, check=False)


class EmulatedCluster:
    """P ranks in their own namespaces behind a shaped bridge; a context manager that always cleans up."""

    def __init__(self, ranks: int, bandwidth: str | float, delay: str | float = 0.0, prefix: str = PREFIX,
                 realtime: bool = True, burst: float | None = None, ranks_per_node: int = 1) -> None:
        if ranks < 2 or ranks > 64:
            raise ClusterError(f"--ranks must be 2 … 64, got {ranks}")
        if not splits_into_nodes(ranks, ranks_per_node):
            raise ClusterError(f"--ranks-per-node must divide --ranks into two or more nodes (got {ranks_per_node} "
                               f"for {ranks} ranks)")
        self.ranks_per_node = ranks_per_node
        self.nodes = ranks // ranks_per_node
        self.rate = parse_rate(bandwidth) if isinstance(bandwidth, str) else float(bandwidth)  # bytes/s
        if self.rate <= 0:
            raise ClusterError("--bandwidth must be positive, e.g. 1Gbit or 100Mbit")
        self.delay = parse_duration(delay) if isinstance(delay, str) else float(delay)  # seconds, one way
        if not 0 <= self.delay <= 1:
            raise ClusterError(f"--delay must be 0 … 1 s one way, e.g. 0.5ms, got {delay}")
        check_prefix(prefix)
        self.ranks, self.prefix, self.realtime = ranks, prefix, realtime
        self.bridge_ns = f"{prefix}-br"  # the bridge, or with a delay the forwarder
        self.mtu = TUN_MTU if self.delay > 0 else MTU
        if burst is not None and not burst >= self.mtu:
            raise ClusterError(f"--burst must be at least one packet ({self.mtu} bytes), got {burst:g}")
        self.burst = int(burst) if burst is not None else max(2 * self.mtu, int(self.rate / 1000))
        self._signals = contextlib.ExitStack()
        self._forwarder: subprocess.Popen | None = None

    def node_ns(self, node: int) -> str:
        return f"{self.prefix}-r{node}"

    def ns(self, rank: int) -> str:
        """The namespace rank ``rank`` runs in (its node's)."""
        return self.node_ns(rank // self.ranks_per_node)

    def address(self, rank: int) -> str:
        """Rank ``rank``'s address: its node's."""
        return f"{SUBNET}.{rank // self.ranks_per_node + 1}"

    def up(self) -> EmulatedCluster:
        """Build the namespaces, bridge and shaping; on any failure, remove what was built."""
        check_available()
        refuse_if_up(self.prefix)
        try:
            self._build()
        except BaseException:
            teardown(self.prefix)
            raise
        return self

    def __enter__(self) -> EmulatedCluster:
        self._signals.enter_context(signals_interrupt(signal.SIGTERM, signal.SIGHUP))  # so __exit__ runs
        try:
            return self.up()
        except BaseException:
            self._signals.close()
            raise

    def _build(self) -> None:
        _ip("netns", "add", self.bridge_ns)
        for n in range(self.nodes):
            _ip("netns", "add", self.node_ns(n))
        if self.delay > 0:
            self._build_forwarded()
        else:
            self._build_bridged()
        for n in range(self.nodes):
            ns = self.node_ns(n)
            _ip("link", "set", "eth0", "mtu", str(self.mtu), ns=ns)
            _ip("addr", "add", f"{SUBNET}.{n + 1}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            self._shape(ns, "eth0")

    def knobs(self) -> str:
        """The shaping settings that change measured times, in one line."""
        line = (f"tbf rate {self.rate * 8 / 1e6:g} Mbit/s, burst {self.burst:,} B (a message up to the burst leaves "
                "at line speed, so small collectives look faster than the rate)")
        if self.delay > 0:
            line += (f"; delay forwarder holds each packet {self.delay * 1e3:g} ms and serialises it at "
                     f"{self.rate * 8 / 1e6:g} Mbit/s (store-and-forward: a large message pays its size twice "
                     "at the rate, once into the forwarder and once out)")
        return line

    def _shape(self, ns: str, dev: str) -> None:
        # default burst: ≥ 2 packets, and ≥ one kernel tick (1 ms) of tokens at this rate
        _tc(ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{int(self.rate * 8)}bit", "burst",
            str(self.burst), "latency", "100ms")

    def _build_bridged(self) -> None:
        _ip("link", "add", "br0", "type", "bridge", ns=self.bridge_ns)
        _ip("link", "set", "br0", "up", ns=self.bridge_ns)
        for n in range(self.nodes):
            port = f"vb{n}"
            _ip("link", "add", "eth0", "netns", self.node_ns(n), "type", "veth", "peer", "name", port,
                "netns", self.bridge_ns)
            _ip("link", "set", port, "master", "br0", ns=self.bridge_ns)
            _ip("link", "set", port, "up", ns=self.bridge_ns)
            self._shape(self.bridge_ns, port)  # what node n receives

    def _build_forwarded(self) -> None:
        argv = [sys.executable, "-m", DELAY_FORWARDER, "--ranks", str(self.nodes), "--delay",
                repr(self.delay), "--rate", repr(self.rate), "--subnet", SUBNET]
        # above the ranks' real-time priority: a starved forwarder would add its own delay
        prio = ["chrt", "-f", "2"] if self.realtime and realtime_allowed() else []
        self._forwarder = subprocess.Popen(["ip", "netns", "exec", self.bridge_ns, *prio, *argv],
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                           start_new_session=True)  # outlives `arcsim cluster up`
        line = self._forwarder.stdout.readline().strip() if self._forwarder.stdout else ""
        if line != "ready":
            self._forwarder.kill()
            err = self._forwarder.communicate(timeout=10)[1].strip().splitlines()
            raise ClusterError(f"the delay forwarder did not start: {err[-1] if err else 'no output'}")
        for n in range(self.nodes):
            _ip("link", "set", f"tun{n}", "netns", self.node_ns(n), ns=self.bridge_ns)
            _ip("link", "set", f"tun{n}", "name", "eth0", ns=self.node_ns(n))

    def env(self, rank: int, port: int = 29500) -> dict[str, str]:
        """torch.distributed environment for rank ``rank`` (rank 0 is the rendezvous)."""
        return {"MASTER_ADDR": self.address(0), "MASTER_PORT": str(port), "RANK": str(rank),
                "WORLD_SIZE": str(self.ranks), "LOCAL_RANK": str(rank % self.ranks_per_node),
                "LOCAL_WORLD_SIZE": str(self.ranks_per_node), "GLOO_SOCKET_IFNAME": "eth0",
                "OMP_NUM_THREADS": "1"}  # as torchrun sets it: ranks sharing cores must not spin on each other

    @functools.cached_property
    def _realtime_ranks(self) -> bool:
        return self.realtime and self.delay == 0 and realtime_allowed()  # see the module docstring

    def command(self, rank: int, argv: Sequence[str]) -> list[str]:
        prefix = ["ip", "netns", "exec", self.ns(rank)]
        if self._realtime_ranks:
            prefix += ["chrt", "-f", "1"]
        return [*prefix, *argv]

    def run(self, module: str, args: Sequence[str], timeout: float, script: bool = False) -> None:
        """``python -m module *args`` (``python module *args`` where ``script``) on every rank at once, forked from
        a server that imported torch once (arcsim.testbed.ranks); an ArcsimError with a failing rank's output, or
        after ``timeout`` seconds."""
        from arcsim.processes import free_port
        from arcsim.testbed.ranks import RankLaunch, run_ranks

        port = free_port()
        run_ranks([RankLaunch(module, tuple(args), {**os.environ, **self.env(rank, port)}, self.ns(rank),
                              self._realtime_ranks, script) for rank in range(self.ranks)], timeout)

    def spawn(self, rank: int, argv: Sequence[str], port: int = 29500, **popen) -> subprocess.Popen:
        env = {**os.environ, **self.env(rank, port), **popen.pop("env", {})}
        return subprocess.Popen(self.command(rank, argv), env=env, **popen)

    def qdiscs(self) -> str:
        """`tc qdisc show` of every shaped interface (for checks and reports)."""
        lines = []
        for n in range(self.nodes):
            shaped = [(self.node_ns(n), "eth0")] + ([] if self.delay > 0 else [(self.bridge_ns, f"vb{n}")])
            for where, dev in shaped:
                out = subprocess.run(["ip", "netns", "exec", where, "tc", "qdisc", "show", "dev", dev],
                                     capture_output=True, text=True).stdout.strip()
                lines.append(f"{where}/{dev}: {out}")
        return "\n".join(lines)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        teardown(self.prefix)
        if self._forwarder is not None:  # killed by the tear-down; reap it
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._forwarder.communicate(timeout=10)
        self._signals.close()

