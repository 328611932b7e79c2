"""The step descriptions: textbook costs on a flat cluster, and what every algorithm must move."""

import math

import numpy as np
import pytest
from conftest import flat, multi

from arcsim.collectives import ALGORITHMS, build, busbw_factor, make_step, normalize_op
from arcsim.collectives.tree import double_binary_trees
from arcsim.errors import CollectiveError
from arcsim.netsim import analytic
from arcsim.pricing import plan

SIZES = [1e3, 1e6, 1e8]


def closed(op, algo, topo, n):
    return analytic.schedule_time(build(op, algo, n, topo), topo)


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 12, 16, 64])
@pytest.mark.parametrize("n", SIZES)
def test_textbook_formulas_hold_exactly_on_a_flat_cluster(p, n):
    gamma = 1e-10
    t = flat(p, gbps=10, latency=20e-6, gamma=gamma)
    a, b = t.network.latency, 1 / t.network.bandwidth_per_nic
    f = (p - 1) / p
    lg = math.ceil(math.log2(p))
    assert closed("allreduce", "ring", t, n) == pytest.approx(2 * (p - 1) * a + 2 * f * n * b + f * n * gamma,
                                                             rel=1e-12)
    assert closed("allgather", "ring", t, n) == pytest.approx((p - 1) * a + f * n * b, rel=1e-12)
    assert closed("allgather", "rd", t, n) == pytest.approx(lg * a + f * n * b, rel=1e-12)
    assert closed("reducescatter", "ring", t, n) == pytest.approx((p - 1) * a + f * n * b + f * n * gamma,
                                                                 rel=1e-12)
    assert closed("broadcast", "binomial", t, n) == pytest.approx(lg * (a + n * b), rel=1e-12)
    chain = build("broadcast", "chain", n, t)
    s = int(chain.detail.split()[0])
    assert closed("broadcast", "chain", t, n) == pytest.approx((p - 2 + s) * (a + n * b / s), rel=1e-12)
    assert closed("broadcast", "flat", t, n) == pytest.approx(a + (p - 1) * n * b, rel=1e-12)
    if p & (p - 1) == 0:  # gloo's eager binomial: a rank at depth k sends to its log2 p − k children at once
        k = int(math.log2(p))
        assert closed("broadcast", "eager", t, n) == pytest.approx(k * a + k * (k + 1) / 2 * n * b, rel=1e-12)
    assert closed("allreduce", "binomial", t, n) == pytest.approx(2 * lg * (a + n * b) + lg * n * gamma, rel=1e-12)
    if p & (p - 1) == 0:  # the textbook forms of these two are for powers of two
        k = int(math.log2(p))
        assert closed("allreduce", "rhd", t, n) == pytest.approx(2 * k * a + 2 * f * n * b + f * n * gamma,
                                                                rel=1e-12)
        assert closed("allreduce", "rd", t, n) == pytest.approx(k * (a + n * b + n * gamma), rel=1e-12)


@pytest.mark.parametrize(("nodes", "gpus"), [(2, 2), (4, 8), (8, 4), (3, 8)])
@pytest.mark.parametrize("n", SIZES)
def test_two_level_formula_with_a_nic_per_gpu(nodes, gpus, n):
    t = multi(nodes, gpus, nics=gpus)
    ai, bi = t.intra.latency, 1 / t.intra.bandwidth
    ao, bo = t.network.latency, 1 / t.network.bandwidth_per_nic
    g, m = gpus, nodes
    expected = 2 * (g - 1) * ai + 2 * (g - 1) / g * n * bi + 2 * (m - 1) * ao + 2 * (m - 1) / m * (n / g) * bo
    assert closed("allreduce", "hierarchical", t, n) == pytest.approx(expected, rel=1e-12)


def test_gpus_sharing_one_nic_slow_the_cross_node_phase_by_their_number():
    n, g, m = 1e8, 8, 4
    shared, own = multi(m, g, nics=1), multi(m, g, nics=g)
    bo = 1 / own.network.bandwidth_per_nic
    extra = 2 * (m - 1) / m * (n / g) * bo * (g - 1)  # the g rails now queue on one NIC
    diff = closed("allreduce", "hierarchical", shared, n) - closed("allreduce", "hierarchical", own, n)
    assert diff == pytest.approx(extra, rel=1e-9)


def _received(schedule):
    return schedule.bytes_received()


@pytest.mark.parametrize("topo", [flat(7), flat(8), multi(4, 4, 1), multi(3, 8, 8)], ids=lambda t: t.name)
def test_what_each_algorithm_moves(topo):
    p, n = topo.ranks, 1e6
    for algo in ALGORITHMS["allgather"]:
        assert np.allclose(_received(build("allgather", algo, n, topo)), (p - 1) / p * n), algo
    for algo in ALGORITHMS["reducescatter"]:
        rs = build("reducescatter", algo, n, topo)
        assert np.allclose(_received(rs), (p - 1) / p * n), algo
        assert sum((s.reduce * s.repeat).sum() for s in rs.steps) == pytest.approx((p - 1) * n), algo
    assert len(build("reducescatter", "rd", n, topo).steps) == math.ceil(math.log2(p))
    for algo in ALGORITHMS["broadcast"]:
        got = _received(build("broadcast", algo, n, topo))
        assert got[0] == 0 and np.allclose(got[1:], n), algo
    ring = build("allreduce", "ring", n, topo)
    assert np.allclose(ring.bytes_sent(), 2 * (p - 1) / p * n)
    tree = build("allreduce", "tree", n, topo)
    assert tree.bytes_sent().sum() == pytest.approx(2 * (p - 1) * n)  # each tree: n/2 up and down every edge
    assert sum((s.reduce * s.repeat).sum() for s in tree.steps) == pytest.approx((p - 1) * n)
    for algo in ("rhd", "rd"):
        s = build("allreduce", algo, n, topo)
        reduced = sum((st.reduce * st.repeat).sum() for st in s.steps)
        # every contribution beyond one rank's own must be folded in somewhere
        assert reduced >= (p - 1) / p * n * p - 1e-6, algo


def test_double_binary_trees_are_trees_with_complementary_leaves():
    for p in (2, 5, 8, 33, 64):
        for parent in double_binary_trees(p):
            assert (parent < 0).sum() == 1
            for v in range(p):  # every rank reaches the root
                seen = 0
                while parent[v] >= 0 and seen <= p:
                    v, seen = parent[v], seen + 1
                assert seen <= p
        a, b = double_binary_trees(p)
        inner_a = np.isin(np.arange(p), a[a >= 0])
        inner_b = np.isin(np.arange(p), b[b >= 0])
        assert (inner_a & inner_b).sum() <= max(1, p // 8)


def test_repeated_steps_are_folded_and_duplicate_pairs_merged():
    step = make_step([0, 0, 1], [1, 1, 2], [5.0, 7.0, 1.0], [1.0, 2.0, 0.0])
    assert step.src.tolist() == [0, 1] and step.nbytes.tolist() == [12.0, 1.0] and step.reduce.tolist() == [3, 0]
    ring = build("allreduce", "ring", 1e6, flat(64))
    assert len(ring.steps) == 2 and ring.step_count == 126


def test_auto_picks_the_cheapest_closed_form():
    t = multi(8, 8, nics=1)
    for op in ALGORITHMS:
        for n in (1e3, 1e8):
            times = {a: closed(op, a, t, n) for a in ALGORITHMS[op]}
            assert plan(t, op, "auto", n).algo == min(times, key=times.get)
    # small messages favour few steps, large ones bandwidth-optimal algorithms
    assert plan(flat(64), "allreduce", "auto", 1e3).algo in ("rd", "rhd", "tree")
    assert plan(flat(64), "allreduce", "auto", 1e9).algo in ("ring", "rhd", "hierarchical")


def test_bus_bandwidth_factors():
    assert busbw_factor("allreduce", 8) == pytest.approx(1.75)
    assert busbw_factor("all-gather", 8) == pytest.approx(0.875)
    assert busbw_factor("broadcast", 8) == 1.0


def test_unknown_op_and_algorithm():
    with pytest.raises(CollectiveError, match="allreduce"):
        normalize_op("scatter")
    assert normalize_op("all-to-all") == normalize_op("a2a") == "alltoall"
    with pytest.raises(CollectiveError, match="ring"):
        build("allgather", "tree", 1e6, flat(4))


@pytest.mark.parametrize(("nodes", "gpus", "chunks", "channels"),
                         [(1, 8, 4, 1), (8, 8, 17, 1), (5, 1, 64, 1), (3, 4, 1, 1), (2, 8, 5, 8), (4, 8, 3, 4)])
def test_the_kept_tree_pattern_scaled_is_the_tree_built_afresh(nodes, gpus, chunks, channels):
    """chain_tree_all_reduce builds the message pattern once and scales it by the chunk size."""
    from arcsim.collectives import tree

    for nbytes in (1e3, 3.7e8):
        trees = tuple(t for head in range(channels) for t in tree.node_chain_trees(nodes, gpus, head))
        fresh = tree.pipelined_tree_all_reduce(trees, nbytes, chunks)
        kept = tree.chain_tree_all_reduce(nodes, gpus, nbytes, chunks, channels)
        assert len(kept) == len(fresh)
        for a, b in zip(kept, fresh, strict=True):
            assert np.array_equal(a.src, b.src) and np.array_equal(a.dst, b.dst) and a.repeat == b.repeat
            assert np.allclose(a.nbytes, b.nbytes, rtol=1e-12) and np.allclose(a.reduce, b.reduce, rtol=1e-12)


@pytest.mark.parametrize(("nodes", "gpus", "channels"), [(1, 8, 1), (8, 8, 1), (5, 1, 1), (3, 4, 1), (2, 8, 8),
                                                         (4, 8, 4), (33, 8, 8), (100, 2, 2)])
def test_the_tree_counts_its_messages_as_built_without_building(nodes, gpus, channels):
    """The messages counted from the trees' edges are those the built steps hold, pairs merged in a step and all."""
    from arcsim.collectives import tree

    for chunks in (1, 2, 7, 64):
        built = sum(s.messages * s.repeat for s in tree.chain_tree_all_reduce(nodes, gpus, 1e6, chunks, channels))
        assert tree.chain_tree_messages(nodes, gpus, chunks, channels) == built


def test_the_kept_tree_patterns_hold_at_most_their_bound(monkeypatch):
    """The patterns kept drop the least recently used past PATTERN_MESSAGES, and one built again is the same."""
    from arcsim.collectives import tree

    monkeypatch.setattr(tree, "_patterns", type(tree._patterns)())
    monkeypatch.setattr(tree, "PATTERN_MESSAGES", 2_000)
    first = tree.chain_tree_all_reduce(4, 8, 1e6, 1)
    for chunks in range(2, 12):
        tree.chain_tree_all_reduce(4, 8, 1e6, chunks)
    held = sum(s.messages for steps in tree._patterns.values() for s in steps)
    assert held <= 2_000 and (4, 8, 1, 1) not in tree._patterns and (4, 8, 11, 1) in tree._patterns
    again = tree.chain_tree_all_reduce(4, 8, 1e6, 1)
    assert [(a.src.tolist(), a.nbytes.tolist()) for a in again] == [(a.src.tolist(), a.nbytes.tolist()) for a in first]


def _reference_tree_all_reduce(trees: tuple[np.ndarray, ...], nbytes: float, chunks: int) -> list:
    """The pipelined tree all-reduce as first written (594ce7f): every step built from each tree's ranks in turn,
    depths and heights by a walk of each tree; kept here to hold the edge-based builder to the same steps."""
    from arcsim.collectives.schedule import make_step
    from arcsim.collectives.tree import merge_repeats

    def depths_and_heights(parent):
        depth, height = np.zeros(parent.size, dtype=np.int64), np.zeros(parent.size, dtype=np.int64)
        children = [[] for _ in range(parent.size)]
        for v, u in enumerate(parent):
            if u >= 0:
                children[u].append(v)
        order, stack = [], [int(np.flatnonzero(parent < 0)[0])]
        while stack:
            v = stack.pop()
            order.append(v)
            for c in children[v]:
                depth[c] = depth[v] + 1
                stack.append(c)
        for v in reversed(order):
            if parent[v] >= 0:
                height[parent[v]] = max(height[parent[v]], height[v] + 1)
        return depth, height

    chunk = nbytes / len(trees) / chunks
    shaped = [(parent, *depths_and_heights(parent)) for parent in trees]
    senders = [np.flatnonzero(parent >= 0) for parent, _, _ in shaped]
    steps = []
    for reduce, start_of in ((True, lambda d, h: h), (False, lambda d, h: d - 1)):
        length = max(chunks + int(start_of(d, h)[v].max()) for (_, d, h), v in zip(shaped, senders, strict=True))
        for t in range(length):
            src, dst = [], []
            for (parent, d, h), v in zip(shaped, senders, strict=True):
                start = start_of(d, h)[v]
                active = v[(t >= start) & (t < start + chunks)]
                src.append(active if reduce else parent[active])
                dst.append(parent[active] if reduce else active)
            s, r = np.concatenate(src), np.concatenate(dst)
            if s.size:
                steps.append(make_step(s, r, chunk, chunk if reduce else 0.0))
    return merge_repeats(steps)


@pytest.mark.parametrize("nodes", [1, 2, 3, 5, 9])
def test_the_tree_pattern_from_edges_is_the_first_written_one_step_for_step(nodes):
    """Every step, message order and repeat count of the edge-based builder equal the first per-step one's, with
    more chunks than levels (repeated windows), fewer (no repeats) and one, over channels and node shapes."""
    from arcsim.collectives import tree

    for gpus in (1, 2, 8):
        for channels in (1, 2, 4):
            if nodes * gpus < 2:
                continue
            trees = tuple(t for head in range(channels) for t in tree.node_chain_trees(nodes, gpus, head))
            levels = tree.node_tree_depth(nodes, gpus)
            for chunks in sorted({1, 2, levels, levels + 1, levels + 3, 64}):
                new = tree.pipelined_tree_all_reduce(trees, 3.0e6, chunks)
                old = _reference_tree_all_reduce(trees, 3.0e6, chunks)
                assert len(new) == len(old), (gpus, channels, chunks)
                for a, b in zip(new, old, strict=True):
                    assert np.array_equal(a.src, b.src) and np.array_equal(a.dst, b.dst) and a.repeat == b.repeat
                    assert np.array_equal(a.nbytes, b.nbytes) and np.array_equal(a.reduce, b.reduce)


@pytest.mark.parametrize(("nodes", "gpus", "head"), [(2, 8, 0), (2, 8, 5), (5, 4, 3), (3, 1, 0)])
def test_each_tree_channel_is_a_tree_that_crosses_nodes_only_between_its_head_gpus(nodes, gpus, head):
    from arcsim.collectives import tree

    for parent in tree.node_chain_trees(nodes, gpus, head):
        assert (parent < 0).sum() == 1
        for v in range(parent.size):  # every rank reaches the root
            hops = 0
            while parent[v] >= 0:
                v, hops = parent[v], hops + 1
            assert hops <= tree.node_tree_depth(nodes, gpus)
        child = np.flatnonzero(parent >= 0)
        crossing = child[child // gpus != parent[child] // gpus]
        assert np.all(crossing % gpus == head) and np.all(parent[crossing] % gpus == head)


def _nic_sends(schedule, topo):
    """Bytes each (node, NIC) sends to other nodes over the whole schedule."""
    g, nics = topo.gpus_per_node, topo.network.nics_per_node
    out = np.zeros((topo.nodes, nics))
    for s in schedule.steps:
        cross = s.src // g != s.dst // g
        np.add.at(out, (s.src[cross] // g, s.src[cross] % g % nics), s.nbytes[cross] * s.repeat)
    return out


@pytest.mark.parametrize("nics", [1, 2, 8])
def test_the_tree_spreads_its_channels_over_every_nic(nics):
    """As NCCL runs its tree channels one per NIC: on two nodes each node sends n over the network in all
    (its half of each tree up, the other half down), split evenly over its NICs."""
    topo, n = multi(2, 8, nics=nics), 1e8
    sent = _nic_sends(build("allreduce", "tree", n, topo), topo)
    assert np.allclose(sent, n / nics)


def test_on_two_nodes_bound_by_their_nics_the_tree_beats_the_ring_by_nearly_its_extra_traffic():
    """The ring sends 2(p − 1)/p · n through each node's NICs, the two-node tree n: with NICs the bottleneck
    (8 × 25 Gbit/s under NVLink) the tree is close to 2(p − 1)/p = 1.875 times faster, and NCCL's
    choice (the cheaper) is the tree; with one NIC the tree's channels all share it, the same ratio holds."""
    for nics in (1, 8):
        topo, n = multi(2, 8, nics=nics, gbps=25, library="nccl"), 1e9
        ring, tree_time = closed("allreduce", "ring", topo, n), closed("allreduce", "tree", topo, n)
        assert 1.6 < ring / tree_time < 1.875
        assert plan(topo, "allreduce", "auto", n).algo == "tree"
