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


def _port_count(topo: Topology) -> int:
    """Ports of the topology: each GPU's send and receive side, then each NIC's."""
    return 2 * topo.ranks + 2 * topo.nodes * topo.network.nics_per_node


def _ports(src: np.ndarray, dst: np.ndarray, topo: Topology, same: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Send-side and receive-side port index of every message (of :func:`_port_count`)."""
    p, g, nics = topo.ranks, topo.gpus_per_node, topo.network.nics_per_node
    nic_count = topo.nodes * nics

    def nic(rank: np.ndarray) -> np.ndarray:
        return (rank // g) * nics + (rank % g) % nics

    tx = np.where(same, src, 2 * p + nic(src))
    rx = np.where(same, p + dst, 2 * p + nic_count + nic(dst))
    return tx, rx


def step_time(step: Step, topo: Topology) -> float:
    """One step's cost: the definition (:func:`schedule_time` computes the same for many steps at once)."""
    return float(_step_times([step], topo)[0])


BATCH_SLOTS = 1 << 22  # steps priced together while (steps × ports) stays under this (scratch of a few 10 MB)


def _step_times(steps: list[Step], topo: Topology) -> np.ndarray:
    """Each step's cost, the steps' messages concatenated and priced in one pass (step k's ports are slots
    k·P … k·P + P − 1): a few numpy calls per batch instead of per step, which dominated pricing."""
    counts = np.array([s.messages for s in steps])
    out = np.zeros(len(steps))
    if not counts.sum():
        return out
    src, dst = np.concatenate([s.src for s in steps]), np.concatenate([s.dst for s in steps])
    nbytes, reduce = np.concatenate([s.nbytes for s in steps]), np.concatenate([s.reduce for s in steps])
    which = np.repeat(np.arange(len(steps)), counts)
    same, latency, bandwidth = topo.link_arrays(src, dst)
    ports = _port_count(topo)
    tx, rx = _ports(src, dst, topo, same)
    tx, rx = which * ports + tx, which * ports + rx
    seconds = nbytes / bandwidth
    slots = len(steps) * ports
    load = np.bincount(tx, seconds, slots) + np.bincount(rx, seconds, slots)
    message = latency + np.maximum(load[tx], load[rx])
    # a rank costs its slowest message plus γ × what it reduces, a step its slowest rank: so the largest
    # message + γ·reduced over each message's two ends (a rank without messages reduces nothing)
    at_src, at_dst = which * topo.ranks + src, which * topo.ranks + dst
    reduced = topo.gamma * np.bincount(at_dst, reduce, len(steps) * topo.ranks)
    cost = np.maximum(message + reduced[at_src], message + reduced[at_dst])
    busy = counts > 0
    out[busy] = np.maximum.reduceat(cost, (np.cumsum(counts) - counts)[busy])
    return out


def schedule_time(schedule: Schedule, topo: Topology) -> float:
    """Σ repeat × step cost, the steps priced in batches of at most BATCH_SLOTS (steps × ports)."""
    per_batch = max(1, BATCH_SLOTS // _port_count(topo))
    steps = schedule.steps
    times = np.concatenate([_step_times(list(steps[i:i + per_batch]), topo) for i in range(0, len(steps), per_batch)]
                           or [np.zeros(0)])
    return float(sum(step.repeat * t for step, t in zip(steps, times.tolist(), strict=True)))
