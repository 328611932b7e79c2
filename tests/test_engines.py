"""The SimPy DES held to the closed form where its assumptions hold, and what only the DES can show."""

import numpy as np
import pytest
from conftest import flat, multi

from arcsim.collectives import ALGORITHMS, build
from arcsim.netsim import des, estimate
from arcsim.pricing import start_times
from arcsim.topology import load_topology

CASES = [(op, algo) for op, algos in ALGORITHMS.items() for algo in algos]


def both(op, algo, topo, n, **kw):
    s = build(op, algo, n, topo)
    return estimate(s, topo, "analytic").time_s, estimate(s, topo, "des", **kw).time_s


@pytest.mark.parametrize(("op", "algo"), CASES)
@pytest.mark.parametrize("p", [2, 3, 6, 8, 16])
@pytest.mark.parametrize("n", [1e3, 1e6, 1e8])
def test_des_matches_closed_form_on_a_flat_cluster(op, algo, p, n):
    a, d = both(op, algo, flat(p, gamma=2e-11), n)
    assert d == pytest.approx(a, rel=0.01)


@pytest.mark.parametrize(("op", "algo"), CASES)
def test_the_closed_form_prices_steps_in_batches_exactly_as_one_by_one(op, algo, monkeypatch):
    """schedule_time prices many steps in one pass; step by step (step_time, the definition) it is the same,
    also when the steps are split into several batches."""
    from arcsim.netsim import analytic

    topo = multi(4, 8, 2)
    s = build(op, algo, 3e7, topo)
    one_by_one = sum(step.repeat * analytic.step_time(step, topo) for step in s.steps)
    assert analytic.schedule_time(s, topo) == pytest.approx(one_by_one, rel=1e-12)
    monkeypatch.setattr(analytic, "BATCH_SLOTS", 1)  # one step per batch
    assert analytic.schedule_time(s, topo) == pytest.approx(one_by_one, rel=1e-12)


PIPELINED = {("allreduce", "tree"), ("broadcast", "chain")}
UNEVEN = PIPELINED | {("broadcast", "eager")}  # ranks leave their steps at different times over unequal links


@pytest.mark.parametrize(("op", "algo"), [c for c in CASES if c not in UNEVEN])
@pytest.mark.parametrize("shape", [(2, 4, 4), (4, 8, 8), (4, 4, 1), (3, 8, 2)])
@pytest.mark.parametrize("n", [1e4, 1e8])
def test_des_matches_closed_form_on_multi_gpu_nodes(op, algo, shape, n):
    """With NICs shared inside a node too. Pipelines over unequal links are excluded: see below."""
    a, d = both(op, algo, multi(*shape), n)
    assert d == pytest.approx(a, rel=0.01)


@pytest.mark.parametrize("shape", [(2, 4, 4), (4, 8, 8), (4, 4, 1), (3, 8, 2)])
@pytest.mark.parametrize("n", [1e4, 1e8])
def test_tree_pipeline_on_multi_gpu_nodes_is_bounded_by_the_closed_form(shape, n):
    """The closed form charges every step its slowest message; in the DES fast edges run ahead a little."""
    a, d = both("allreduce", "tree", multi(*shape), n)
    assert 0.85 * a <= d <= a * (1 + 1e-9)


@pytest.mark.parametrize("shape", [(2, 4, 4), (4, 8, 8), (4, 4, 1), (3, 8, 2)])
@pytest.mark.parametrize("n", [1e4, 1e8])
def test_eager_broadcast_on_multi_gpu_nodes_differs_from_the_lockstep_bound_both_ways(shape, n):
    """gloo's eager binomial over NVLink + NIC: in the DES a rank fed over NVLink forwards before its step's
    NIC messages finish (faster than the lockstep closed form), and a later step's sends then share a NIC
    with an earlier step's still in flight (slower); measured within 0.3–1.35× of the closed form."""
    a, d = both("broadcast", "eager", multi(*shape), n)
    assert 0.3 * a <= d <= 1.35 * a


def test_pipeline_over_unequal_links_runs_at_its_slowest_link_in_the_des():
    """The closed form charges every chain step at the slowest hop; the DES lets fast hops run ahead."""
    t = multi(8, 8, nics=8)
    a, d = both("broadcast", "chain", t, 1e8)
    assert d < 0.8 * a
    s = build("broadcast", "chain", 1e8, t)
    chunks = int(s.detail.split()[0])
    slow = t.network.latency + 1e8 / chunks / t.network.bandwidth_per_nic
    assert d >= chunks * slow  # still bounded by the slowest hop moving every chunk


def test_oversubscribed_fat_tree_slows_cross_leaf_traffic_only_in_the_des():
    # 2:1 makes each leaf's uplink exactly one NIC wide: a lone flow is not slowed, only shared ones are
    ft = multi(8, 2, nics=1, fabric="fat-tree", nodes_per_leaf=2, oversubscription=2.0)
    full = multi(8, 2, nics=1, fabric="fat-tree", nodes_per_leaf=2, oversubscription=1.0)
    a_ft, d_ft = both("allreduce", "rd", ft, 1e8)
    a_full, d_full = both("allreduce", "rd", full, 1e8)
    assert a_ft == pytest.approx(a_full)  # the closed form does not see the core
    assert d_full == pytest.approx(a_full, rel=0.01)
    assert d_ft > 1.5 * d_full
    # a ring crosses each leaf boundary once per step: no contention, so no penalty
    assert both("allreduce", "ring", ft, 1e8)[1] == pytest.approx(both("allreduce", "ring", full, 1e8)[1],
                                                                  rel=1e-9)


def test_one_straggler_delays_the_collective():
    plain = flat(8)
    slow = flat(8, stragglers={3: 1.5})
    compute = 0.02
    s = build("allreduce", "ring", 1e7, plain)
    base = estimate(s, plain, "des").time_s
    late = estimate(s, slow, "des", start_times=start_times(slow, compute)).time_s
    assert late >= base + 0.5 * compute * 0.999
    assert estimate(s, slow, "analytic").time_s == pytest.approx(estimate(s, plain, "analytic").time_s)


def test_straggler_slows_its_own_reductions():
    slow = flat(4, gamma=1e-9, stragglers={1: 3.0})
    s = build("allreduce", "ring", 1e7, slow)
    assert estimate(s, slow, "des").time_s > 1.5 * estimate(s, flat(4, gamma=1e-9), "des").time_s


def test_jitter_is_seeded_and_only_adds_time():
    calm, noisy = flat(8), flat(8, jitter=0.5)
    s = build("allreduce", "rhd", 1e4, calm)
    base = estimate(s, calm, "des").time_s
    one = estimate(s, noisy, "des", seed=1).time_s
    assert one > base
    assert estimate(s, noisy, "des", seed=1).time_s == one
    assert estimate(s, noisy, "des", seed=2).time_s != one


@pytest.mark.parametrize("topo", [multi(4, 4, 1), multi(4, 4, 4), multi(3, 2, 1),
                                  multi(8, 2, 1, fabric="fat-tree", nodes_per_leaf=2, oversubscription=2.0)],
                         ids=lambda t: t.name + t.network.fabric)
@pytest.mark.parametrize(("op", "algo"), [("allreduce", "ring"), ("allreduce", "hierarchical"),
                                          ("allgather", "rd"), ("allgather", "hierarchical"),
                                          ("reducescatter", "ring")])
def test_symmetry_gives_the_same_answer_as_simulating_every_rank(topo, op, algo):
    s = build(op, algo, 3e7, topo)
    folded = des.simulate(s, topo)
    every = des.simulate(s, topo, use_symmetry=False)
    assert folded.simulated_ranks < topo.ranks and every.simulated_ranks == topo.ranks
    assert folded.time_s == pytest.approx(every.time_s, rel=1e-9)
    assert folded.events < every.events


def test_symmetry_is_refused_when_the_schedule_is_not_shift_invariant():
    t = multi(4, 4, 1)
    # recursive halving is not unchanged by shifting nodes, only by rotating GPU indices by 2 (i → i XOR 2)
    rhd = build("allreduce", "rhd", 1e6, t)
    folded = des.simulate(rhd, t)
    assert folded.simulated_ranks == t.nodes * 2
    assert folded.time_s == pytest.approx(des.simulate(rhd, t, use_symmetry=False).time_s, rel=1e-9)
    assert des.simulate(build("broadcast", "binomial", 1e6, t), t).simulated_ranks == t.ranks


@pytest.mark.parametrize("topo", [multi(4, 8, 8), multi(5, 4, 4), multi(3, 8, 4), multi(4, 6, 3, gamma=1e-11),
                                  multi(8, 4, 4, fabric="fat-tree", nodes_per_leaf=2, oversubscription=2.0),
                                  multi(4, 8, 4, fabric="fat-tree", nodes_per_leaf=2, oversubscription=3.0),
                                  multi(6, 8, 8, fabric="fat-tree", nodes_per_leaf=3, oversubscription=1.5)],
                         ids=lambda t: t.name + t.network.fabric)
@pytest.mark.parametrize(("op", "algo"), [("allreduce", "tree"), ("allreduce", "ring"), ("allreduce", "hierarchical"),
                                          ("allreduce", "rhd"), ("allgather", "ring"), ("alltoall", "direct")])
def test_rotating_gpu_indices_gives_the_same_answer_as_simulating_every_rank(topo, op, algo):
    """Rotating every node's GPU indices (and NICs with them) is a symmetry of a homogeneous cluster whose NICs divide
    its GPUs; NCCL's tree (a channel per NIC) and the rings have it though no shift of nodes leaves the tree alone.
    A NIC two GPUs share and a fat-tree's up- and downlinks carry the images of their simulated flows too."""
    s = build(op, algo, 3e7, topo)
    folded = des.simulate(s, topo)
    every = des.simulate(s, topo, use_symmetry=False)
    assert folded.time_s == pytest.approx(every.time_s, rel=1e-9)
    one_gpu_a_node = every.simulated_ranks // topo.gpus_per_node
    if algo == "hierarchical" or (algo in ("ring", "tree") and topo.network.nics_per_node == topo.gpus_per_node):
        assert folded.simulated_ranks <= one_gpu_a_node  # a ring or tree channel per NIC: rotated onto each other


def test_rotation_is_not_used_with_stragglers_jitter_or_uneven_arrivals():
    s = build("allreduce", "tree", 1e7, multi(4, 4, 4))
    for t in (multi(4, 4, 4, stragglers={5: 1.5}), multi(4, 4, 4, jitter=0.3)):
        assert des.simulate(s, t, seed=1).simulated_ranks == t.ranks
    t = multi(4, 4, 4)
    late = np.zeros(t.ranks)
    late[6] = 1e-4
    assert des.simulate(s, t, start_times=late).simulated_ranks == t.ranks
    assert des.simulate(s, t).simulated_ranks == t.nodes


def test_thousand_rank_collectives_simulate():
    t = load_topology("128x8-ib400x8")
    for algo in ("hierarchical", "ring"):
        s = build("allreduce", algo, 1e8, t)
        r = des.simulate(s, t)
        assert r.simulated_ranks == 1  # one node stands for all (shift), one GPU for its node (rotation)
        assert r.time_s == pytest.approx(estimate(s, t, "analytic").time_s, rel=0.01)
        assert np.isfinite(r.finish_s).all()
