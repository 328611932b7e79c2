"""Closed-form cost of a step schedule: the α–β(–γ) model.

Ports: every GPU has its own intra-node port (send and receive side), and the NICs of a node are
shared by the GPUs mapped to them. In a step, each port's load is the seconds of data it must move
(bytes / bandwidth, summed over the step's messages through it). A message costs its path latency plus
the load of the busier of its two end ports; a rank costs its slowest message plus γ times the bytes
it reduces; a step costs its slowest rank; the schedule costs Σ repeat × step cost.

On a flat topology (one GPU per node, one switch) this is exactly the textbook formulas of
cost-models.md. It does not see contention inside the fabric (oversubscribed fat-tree uplinks),
stragglers, jitter, or ranks running ahead of each other in pipelines over unequal links: those are the
DES's job, and tests compare the two where the closed form's assumptions hold.
"""

from __future__ import annotations

import numpy as np

from arcsim.collectives.schedule import Schedule, Step
from arcsim.topology import Topology


def _ports(step: Step, topo: Topology, same: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Send-side and receive-side port index of every message, and the number of ports."""
    p, g, nics = topo.ranks, topo.gpus_per_node, topo.network.nics_per_node
    nic_count = topo.nodes * nics

    def nic(rank: np.ndarray) -> np.ndarray:
        return (rank // g) * nics + (rank % g) % nics

    tx = np.where(same, step.src, 2 * p + nic(step.src))
    rx = np.where(same, p + step.dst, 2 * p + nic_count + nic(step.dst))
    return tx, rx, 2 * p + 2 * nic_count


def step_time(step: Step, topo: Topology) -> float:
    if step.messages == 0:
        return 0.0
    same, latency, bandwidth = topo.link_arrays(step.src, step.dst)
    tx, rx, ports = _ports(step, topo, same)
    load = np.zeros(ports)
    seconds = step.nbytes / bandwidth
    np.add.at(load, tx, seconds)
    np.add.at(load, rx, seconds)
    message = latency + np.maximum(load[tx], load[rx])
    per_rank = np.full(topo.ranks, -np.inf)
    np.maximum.at(per_rank, step.src, message)
    np.maximum.at(per_rank, step.dst, message)
    reduced = np.zeros(topo.ranks)
    np.add.at(reduced, step.dst, step.reduce)
    return float(np.max(per_rank + topo.gamma * reduced))


def schedule_time(schedule: Schedule, topo: Topology) -> float:
    return float(sum(step.repeat * step_time(step, topo) for step in schedule.steps))
