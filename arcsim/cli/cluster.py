"""`arcsim cluster up | down | status`: an emulated cluster of network namespaces on this machine."""

from __future__ import annotations

import click

from arcsim.cli.common import Count, note
from arcsim.testbed.cluster import PREFIX, EmulatedCluster, check_prefix, namespaces, teardown
from arcsim.units import parse_size


def _checked_prefix(ctx: click.Context, param: click.Parameter, prefix: str) -> str:
    check_prefix(prefix)
    return prefix


prefix_option = click.option("--prefix", default=PREFIX, show_default=True, callback=_checked_prefix,
                             help="Names of the emulated cluster's namespaces: PREFIX-br, PREFIX-r0, …")


@click.group()
def cluster() -> None:
    """An emulated cluster: one network namespace per rank, tbf shaping both ways, optional one-way delay."""


@cluster.command("up")
@click.option("--ranks", "-p", required=True, type=Count(), help="Ranks (2 … 64).")
@click.option("--bandwidth", "-b", required=True, help="Per-node link rate, e.g. 1Gbit, 100Mbit.")
@click.option("--delay", default="0s", show_default=True,
              help="One-way delay added by a user-space TUN forwarder, e.g. 0.5ms (0: a plain bridge).")
@click.option("--burst", default=None, help="tbf burst, e.g. 16kB (default: 2 packets or 1 ms of tokens, the larger).")
@click.option("--ranks-per-node", default=1, show_default=True, type=Count(),
              help="Ranks sharing a node's namespace (loopback between them) and its one link to the others.")
@prefix_option
def cluster_up(ranks: int, bandwidth: str, delay: str, burst: str | None, ranks_per_node: int, prefix: str) -> None:
    """Build it and leave it up (tear down with `arcsim cluster down`)."""
    c = EmulatedCluster(ranks, bandwidth, delay, prefix, burst=parse_size(burst) if burst else None,
                        ranks_per_node=ranks_per_node).up()
    link = f"{bandwidth} each way per node" + (f", {delay} one way" if c.delay else "")
    nodes = "" if ranks_per_node == 1 else f" as {c.nodes} nodes of {ranks_per_node}"
    note(f"up: {ranks} ranks{nodes} in namespaces {c.ns(0)} … {c.ns(ranks - 1)} ({c.address(0)} …), hub in "
         f"{c.bridge_ns}, {link}; run a rank with: ip netns exec {c.ns(0)} CMD")
    note(f"shaping: {c.knobs()}")


@cluster.command("down")
@prefix_option
def cluster_down(prefix: str) -> None:
    """Kill every process in the cluster's namespaces and remove them."""
    removed = teardown(prefix)
    note(f"removed {len(removed)} namespaces" + (f": {', '.join(removed)}" if removed else ""))


@cluster.command("status")
@prefix_option
def cluster_status(prefix: str) -> None:
    """List the cluster's namespaces."""
    names = namespaces(prefix)
    click.echo("\n".join(names) if names else f"no emulated cluster with prefix {prefix!r} is up")
