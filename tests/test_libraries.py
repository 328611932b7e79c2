"""Communication libraries: what each runs, how its transport prices a step, and the published-numbers check."""

import dataclasses
import math

import pytest
from conftest import benchmark, flat, multi, run_cli

from arcsim.catalog import LIBRARY_NAMES
from arcsim.collectives import build
from arcsim.collectives.libraries import LIBRARIES, get_library
from arcsim.collectives.libraries import nccl_tuning as tuning
from arcsim.collectives.libraries.gloo import SERIAL_AT_TWO, STEP_OVERHEAD_S, TCP
from arcsim.errors import CollectiveError
from arcsim.netsim import analytic, estimate
from arcsim.pricing import Pricer, plan, price_collective
from arcsim.topology import Calibrated, load_topology


def test_the_catalogue_names_the_libraries_the_registry_holds():
    assert tuple(LIBRARIES) == LIBRARY_NAMES


def _published():
    return benchmark("published_collectives")


def test_published_nccl_tables_within_the_recorded_errors_by_source_and_band(published_collectives):
    """518 rows of published nccl-tests tables and NCCL maintainers' figures (benchmarks/published): per source and
    size band, the model's MAPE with that source held out of the fit stays where it was measured; over RDMA and EFA
    the mid band (64 KiB – 64 MiB, where compressed buckets live) is under 18.5 % fitted and 21.5 % held out, ≥ 64
    MiB under 9.5 % (before the 2 × 8 H100/B200, 2-rack GB200 and multi-rack NVL72 tables found later and never
    fitted: 13.1, 17.5 and 6.9 %); and the committed constants are what --fit finds."""
    pub = _published()
    table = published_collectives["report"]  # pub.report(show_rows=False), run once for the session
    mid, large = pub.BANDS[1], pub.BANDS[2]
    bound = {("nccl-tests#309", mid): 14, ("azure-jz", mid): 18, ("oci-hpc-oke", mid): 17, ("awsome-dt", mid): 25,
             ("a3mega-ztan", mid): 31, ("nccl-tests#232", mid): 14, ("together", large): 4,
             ("nccl-tests#309", large): 7, ("azure-jz", large): 7, ("awsome-dt", large): 9, ("oci-hpc-oke", large): 11,
             ("nccl-tests#290", large): 3, ("nccl-tests#160", large): 1, ("DeepEP#303", pub.BANDS[0]): 13,
             # never fitted, found after the model was (RDMA's crossing cost is not fitted): unseen clusters
             ("dstack-nebius", mid): 25, ("dstack-lambda", mid): 32, ("oci-gb200", mid): 44, ("coreweave", large): 21}
    for (source, band), limit in bound.items():
        assert table[source][band]["held_out"] < limit, (source, band)
    assert table["RDMA and EFA"][mid]["committed"] < 18.5 and table["RDMA and EFA"][mid]["held_out"] < 21.5
    assert table["RDMA and EFA"][large]["committed"] < 9.5
    assert table["all"][mid]["committed"] < 0.5 * table["all"][mid]["ideal"]
    assert published_collectives["fit"] == pub.NET_STEP_US  # pub.fit(pub.rows())


def test_nvls_is_chosen_where_nvidia_says_and_prices_its_bus_bandwidth():
    """NVLink SHARP on Hopper: one node of 8 H100 reaches ~480 GB/s bus bandwidth (NVIDIA, nccl-tests#212; the
    Together table 479 at 8 GiB), 2 and 4 nodes over 8 × 400 Gb/s 469 and 366 (nccl-tests#309); NCCL's formula
    gives 476, 462 and 364. arcsim chooses NVLS on one node; across nodes its NVLS steps (the hierarchical ones, one
    phase after the other where NCCL pipelines them) lose to the ring. Ampere has none: asking is one clear error."""
    topo = load_topology("1xdgx-h100")
    assert plan(topo, "allreduce", "auto", 8 * 2**30).algo == "nvls"
    res = price_collective(topo, "allreduce", "auto", 8 * 2**30, ("analytic",))[0]
    assert res.busbw_Bps == pytest.approx(476e9, rel=0.01)
    assert tuning.nvls_bus_bandwidth(load_topology("2xdgx-h100")) == pytest.approx(461.6)
    assert tuning.nvls_bus_bandwidth(load_topology("4xdgx-h100")) == pytest.approx(364.0)
    with pytest.raises(CollectiveError, match="NVLS"):
        price_collective(load_topology("2xnd-a100-v4"), "allreduce", "nvls", 1e6, ("analytic",))


@pytest.mark.parametrize("instance", ["gb200-nvl72", "dgx-b200", "dgx-h100", "p5"])
def test_nvls_across_nvlink_domains_never_beats_one_domain(instance: str) -> None:
    """Every byte of an NVLS-tree all-reduce is still reduced inside each NVLink domain: more domains (racks, nodes)
    never raise its bus bandwidth above one domain's, and a rack of 72 GPUs is one domain, not 72 heads (NCCL's
    arity is at most 32). Before: 2 racks of GB200 NVL72 priced at 2.06 TB/s bus, faster than one rack."""
    one = load_topology(f"1x{instance}")
    for nodes in (2, 4, 20):
        many = load_topology(f"{nodes}x{instance}")
        assert tuning.nvls_bus_bandwidth(many) <= tuning.nvls_bus_bandwidth(one) + 1e-9
        one_s = price_collective(one, "allreduce", "auto", 2**29, ("analytic",))[0].time_s
        assert price_collective(many, "allreduce", "auto", 2**29, ("analytic",))[0].time_s > one_s


def test_nccl_mid_band_uses_fewer_channels_and_the_trees_correction():
    """Below its size for all channels NCCL runs fewer (a 64 KiB ring LL all-reduce on 16 ranks: one of 16), and
    its tree gets NVIDIA's correction (0.4 of LL's bandwidth at 512 KiB): the mid band is slower than the
    large-size bandwidth says, and a large message is not."""
    topo = load_topology("2xnd-a100-v4")
    assert tuning.channels_in_use(topo, "allreduce", "ring", 0, 64 * 2**10) == pytest.approx(1 / 16)
    assert tuning.channels_in_use(topo, "allreduce", "ring", 2, 2**30) == 1.0
    assert tuning.size_factor(topo, "allreduce", "tree", 0, 512 * 2**10) == pytest.approx(0.4)
    assert tuning.size_factor(topo, "allreduce", "tree", 2, 2**30) == 1.0


def test_nccl_picks_tree_and_low_latency_protocols_for_small_messages_and_ring_simple_for_large():
    t = load_topology("8x8-ib100")
    assert t.library == "nccl"
    small, large = plan(t, "allreduce", "auto", 1e3), plan(t, "allreduce", "auto", 1e9)
    assert (small.algo, small.choice.protocol.name) == ("tree", "LL")
    assert (large.algo, large.choice.protocol.name) == ("ring", "Simple")
    assert plan(t, "allgather", "auto", 1e6).algo == "ring"
    assert plan(t, "broadcast", "auto", 1e6).algo == "chain"


def test_nccl_ring_over_one_node_is_its_tuning_formula():
    """One node of 8 NVLink GPUs, ring Simple: base 8.4 µs + 14 steps × 3.4 µs + 2·7/8·n / B (tuning.cc), B the
    NVLink bandwidth as NCCL counts it (18 × 20.6 GB/s on an H100 of 450 GB/s line rate)."""
    t = load_topology("1x8-ib400x8")
    n = 1e8
    res = price_collective(t, "allreduce", "ring", n, ("analytic",))
    by_protocol = {c.protocol.name: c for c in get_library("nccl").choices("allreduce", "ring", n, t)}
    simple = by_protocol["Simple"]
    expected = 8.4e-6 + 14 * 3.4e-6 + 2 * 7 / 8 * n / (18 * 20.6e9)
    links = simple.protocol.links(t)
    assert simple.protocol.base_s + analytic.schedule_time(build("allreduce", "ring", n, links), links) == \
        pytest.approx(expected, rel=1e-9)
    assert res[0].time_s <= expected * (1 + 1e-9)  # NCCL takes the cheapest protocol


def test_nccl_ring_across_nodes_pays_the_network_latency_only_on_the_hops_that_cross():
    """8 nodes × 8 GPUs, a tiny all-gather on ring LL: NCCL's latency term is base 6.6 µs + 7 crossing steps ×
    the network's 5 µs (over its LL hop 2.7) + 56 steps × the in-node hop (LL 0.6, raised to the 1 µs network
    overhead of a multi-node ring) = 97.6 µs (tuning.cc), where lock-step steps would charge 63 × 5 µs."""
    t = load_topology("8x8-ib100")
    n = 64.0 * 8  # 8 bytes per rank
    ll = next(c for c in get_library("nccl").choices("allgather", "ring", n, t) if c.protocol.name == "LL")
    links = ll.protocol.links(t)
    for engine in ("analytic", "des"):
        took = ll.protocol.base_s + estimate(build("allgather", "ring", n, links), links, engine).time_s
        assert took == pytest.approx(6.6e-6 + 7 * 5e-6 + 56 * 1.0e-6, rel=0.01), engine
    flat = load_topology("8x1-ib100")  # one GPU per node: every step crosses, nothing changes
    one = next(c for c in get_library("nccl").choices("allgather", "ring", 64.0, flat) if c.protocol.name == "LL")
    assert one.protocol.latency_scale == 1.0 and one.protocol.step_overhead_s == 0.0
    ar = next(c for c in get_library("nccl").choices("allreduce", "ring", n, t) if c.protocol.name == "LL")
    share = 16 / 126  # all-reduce: 2 · 8 crossing steps of 2 · 63 (tuning.cc's nInterSteps)
    assert ar.protocol.latency_scale == pytest.approx(share)


def test_rings_use_every_nic():
    """One ring per NIC: 8 NICs carry a cross-node all-reduce 8× faster than a node-ordered single ring would."""
    eight, one = load_topology("2x8-ib400x8"), load_topology("2x8-ib400")
    t8 = price_collective(eight.with_overrides(library="ideal"), "allreduce", "ring", 8e9, ("analytic",))[0]
    t1 = price_collective(one.with_overrides(library="ideal"), "allreduce", "ring", 8e9, ("analytic",))[0]
    assert t1.time_s / t8.time_s == pytest.approx(8, rel=0.05)


def test_both_engines_agree_under_every_library():
    for lib in LIBRARIES:  # gloo on one rank per node, as it runs (its eager broadcast over NVLink: test_engines)
        t = (flat(4) if lib == "gloo" else multi(2, 4, 2)).with_overrides(library=lib)
        for op in ("allreduce", "allgather", "broadcast"):
            for n in (1e4, 1e7):
                a, d = price_collective(t, op, "auto", n, ("analytic", "des"))
                assert a.algo == d.algo and a.protocol == d.protocol
                assert d.time_s == pytest.approx(a.time_s, rel=0.15), (lib, op, n)


def test_gloo_pays_a_round_trip_and_software_per_step_and_broadcasts_eagerly():
    t = flat(4, gbps=1.0, latency=100e-6).with_overrides(library="gloo")
    n = 1e3
    ring = price_collective(t, "allreduce", "auto", n, ("analytic",))[0]
    bw = t.network.bandwidth_per_nic * TCP.efficiency
    per_step = 2 * 100e-6 + STEP_OVERHEAD_S + n / 4 / bw
    assert (ring.algo, ring.protocol) == ("ring", "tcp")
    assert ring.time_s == pytest.approx(6 * per_step, rel=1e-9)
    s = 1e7
    bcast = price_collective(t, "broadcast", "auto", s, ("analytic",))[0]
    assert bcast.algo == "eager"
    assert bcast.time_s == pytest.approx(3 * s / bw, rel=0.05)  # ≈ 3·S/B at p = 4, as measured
    eight = price_collective(flat(8, gbps=1.0, latency=100e-6).with_overrides(library="gloo"), "broadcast", "auto",
                             s, ("analytic",))[0]
    assert eight.time_s == pytest.approx(6 * s / bw, rel=0.05)  # the root's 3 sends, then 2, then 1


def test_mpi_switches_by_size_as_open_mpi_tuned():
    t = flat(16).with_overrides(library="mpi")
    assert plan(t, "allreduce", "auto", 9_999).algo == "rd"
    assert plan(t, "allreduce", "auto", 10_000).algo == "ring"
    assert plan(t, "allgather", "auto", 49_999).algo == "rd"
    assert plan(t, "allgather", "auto", 50_000).algo == "ring"
    assert plan(t, "broadcast", "auto", 1_000).algo == "binomial"
    big = plan(t, "broadcast", "auto", 64e6)
    assert big.algo == "chain" and big.choice.chunks == 64  # 128 KiB segments, capped at 64 pieces


def test_a_library_without_the_algorithm_says_what_it_would_use():
    t = load_topology("8x8-ib100")
    with pytest.raises(CollectiveError, match=r"nccl has no rhd allreduce .*would use"):
        plan(t, "allreduce", "rhd", 1e6)
    with pytest.raises(CollectiveError, match="unknown library"):
        get_library("mpich")


def test_missing_algorithms_move_what_they_must():
    t = flat(6, latency=10e-6)
    a, b = t.network.latency, 1 / t.network.bandwidth_per_nic
    n = 1e6
    binomial = build("allreduce", "binomial", n, t)
    assert binomial.bytes_received().sum() == pytest.approx(2 * (6 - 1) * n)
    assert analytic.schedule_time(build("broadcast", "flat", n, t), t) == pytest.approx(a + 5 * n * b)
    fixed = build("broadcast", "chain", n, t, chunks=4)
    assert fixed.detail == "4 chunks" and fixed.step_count == 6 - 2 + 4
    with pytest.raises(CollectiveError, match="not pipelined"):
        build("allreduce", "ring", n, t, chunks=4)


def test_nccl_tree_is_chains_inside_nodes_under_a_tree_of_nodes():
    t = multi(4, 4, 1)
    tree = build("allreduce", "tree", 1e6, t)
    inter = [(s, d) for step in tree.steps for s, d in zip(step.src, step.dst, strict=True) if s // 4 != d // 4]
    assert all(s % 4 == 0 and d % 4 == 0 for s, d in inter)  # only each node's first GPU crosses nodes


def test_collective_and_run_price_a_calibrated_topology_the_same_way():
    topo = dataclasses.replace(flat(4), calibration={"broadcast": Calibrated(1e-3, 1e8, 0.99, 4)})
    direct = price_collective(topo, "broadcast", "auto", 1e6, ("analytic",))[0]
    via_run = Pricer(topo).price("broadcast", 1e6)
    assert direct.algo == via_run.algo == "measured" and direct.time_s == via_run.time_s


def test_collective_cli_names_the_library_and_protocol():
    out = run_cli("collective", "-t", "8x8-ib100", "--size", "1kB", "--json", "-")
    assert out.returncode == 0
    import json

    row = json.loads(out.stdout)
    assert row["library"] == "nccl" and row["protocol"] in ("LL", "LL128", "Simple")
    bad = run_cli("collective", "--library", "gloo", "--algo", "tree")
    assert bad.returncode == 2 and "gloo has no tree allreduce" in bad.stderr
    assert math.isfinite(row["time_s"])


def test_nccl_over_sockets_carries_what_tcp_through_the_host_carries():
    """NCCL's socket transport (no RDMA): TCP's payload share of the line (0.94 at MTU 1500, 0.99 at 9000), at most
    the boundary proxy's 4.7 GB/s per direction (fitted on nccl#398 alone), at most two channels × 4 MiB in flight
    per round trip; no LL128 across nodes. Held out: a 1-GPU-a-node 32 GbE table within 5 %, 8 V100 a node on
    100 GbE within 20 % (both were 50-60 % fast as `eth` at full line rate)."""
    assert tuning.tcp_goodput(1500) == pytest.approx(1448 / 1538) and tuning.tcp_goodput(9000) > 0.98
    assert load_topology("2x8-tcp25").to_dict() | {"name": ""} == load_topology("2x8-eth25").to_dict() | {"name": ""}
    slow = load_topology("2x1-tcp100")
    assert tuning.socket_bandwidth(slow) == pytest.approx(tuning.SOCKET_PROXY_GBPS)
    far = dataclasses.replace(slow, network=dataclasses.replace(slow.network, latency=1e-3))
    assert tuning.socket_bandwidth(far) == pytest.approx(2 * 4 * 2**20 / 2e-3 / 1e9)
    jumbo = load_topology("2x1-tcp10")
    jumbo = dataclasses.replace(jumbo, network=dataclasses.replace(jumbo.network, mtu=9000))
    assert tuning.socket_bandwidth(jumbo) > tuning.socket_bandwidth(load_topology("2x1-tcp10")) * 1.04
    for size in (2**10, 2**20, 2**27):
        assert plan(load_topology("4x8-tcp25-a100-nvlink"), "allreduce", "auto", size).choice.protocol.name != "LL128"
    pub = _published()
    held_out = [r for r in pub.rows() if not r.note and (r.source == "nccl#450" or (
        r.source == "nccl#209" and r.topology.endswith("x1-tcp32-v100")))]  # priced: the rows asserted on alone
    assert {r.source for r in held_out} == {"nccl#209", "nccl#450"}
    errors = {(r.source, r.topology, r.bytes): pub.error(r, pub.NET_STEP_US) for r in held_out}
    for (source, topology, _), err in errors.items():
        if source == "nccl#209" and topology.endswith("x1-tcp32-v100"):
            assert abs(err) < 0.05, topology
        if source == "nccl#450":
            assert abs(err) < 0.2


def test_nccl_runs_pat_on_single_gpu_nodes_and_pays_log_hops_over_a_long_link():
    """NCCL's PAT (tuning.cc: all-gather and reduce-scatter, Simple, one GPU a node, no network offload): log2 p
    steps, so 8 single-GPU nodes over a 1 ms link gather a small message in ~3 ms (a measured 8-rank all-gather took
    3.3 ms), where a ring pays 7 hops; nodes of 8 GPUs and GPUDirect-TCPXO never get it."""
    nccl = get_library("nccl")
    assert "pat" in nccl.available("allgather", load_topology("8x1-ib100"))
    assert "pat" not in nccl.available("allgather", load_topology("2x8-ib100"))
    assert "pat" not in nccl.available("allreduce", load_topology("8x1-ib100"))
    with pytest.raises(CollectiveError, match="PAT"):
        price_collective(load_topology("2x8-ib100"), "allgather", "pat", 1e6, ("analytic",))
    far = load_topology("8x1-tcp10")
    far = dataclasses.replace(far, network=dataclasses.replace(far.network, latency=1e-3))
    for op in ("allgather", "reducescatter"):
        small = price_collective(far, op, "auto", 1e4, ("analytic",))[0]
        assert small.algo == "pat" and 3e-3 < small.time_s < 3.5e-3
        assert price_collective(far, op, "ring", 1e4, ("analytic",))[0].time_s > 7e-3
    assert plan(load_topology("8x1-ib100"), "allgather", "auto", 2**28).algo == "ring"  # PAT's bandwidth × 0.75


def test_gloo_runs_a_two_rank_exchange_in_turn_and_a_late_ranks_wait_once():
    """gloo at 2 ranks (SERIAL_AT_TWO): all-to-all 2× and all-gather 1.5× what the same schedule costs with both
    directions at once, on either engine; 3 ranks, the all-reduce and the reduce-scatter (run as an all-reduce) as
    they were; a straggler's wait before the exchange counted once, not in turn."""
    nbytes, two = 533e3, flat(2, 0.1, library="gloo")
    for op, scale in SERIAL_AT_TWO.items():
        chosen = plan(two, op, "auto", nbytes)
        assert chosen.choice.protocol.serial_scale == scale
        at_once = TCP.time_s(estimate(chosen.schedule, TCP.links(two), "analytic").time_s, nbytes)
        analytic, des = price_collective(two, op, "auto", nbytes, ("analytic", "des"))
        assert analytic.time_s == pytest.approx(scale * at_once) and des.time_s == pytest.approx(analytic.time_s)
        assert plan(flat(3, 0.1, library="gloo"), op, "auto", nbytes).choice.protocol.serial_scale == 1.0
        late = dataclasses.replace(two, stragglers={1: 2.0})
        (waited,) = price_collective(late, op, "auto", nbytes, ("des",), compute_s=0.1)
        assert waited.time_s == pytest.approx(0.1 + analytic.time_s, rel=0.01)  # 2 × (0.1 + t) before the mend
    for op in ("allreduce", "reducescatter"):
        assert plan(two, op, "auto", nbytes).choice.protocol.serial_scale == 1.0
