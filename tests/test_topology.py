import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from arcsim.errors import TopologyError
from arcsim.topology import from_name, load_topology, preset_names

REQUIRED_PRESETS = ["8x8-ib100", "8x8-ib400x8", "16x8-ib200", "4x8-roce100", "8x1-eth10", "8x1-eth1",
                    "4x1-eth25", "128x8-ib400x8"]


def test_required_presets_exist_and_load():
    names = preset_names()
    for name in REQUIRED_PRESETS:
        assert name in names
        assert load_topology(name).name == name


@pytest.mark.parametrize("name", REQUIRED_PRESETS)
def test_presets_agree_with_the_name_grammar(name):
    preset, grammar = load_topology(name), from_name(name)
    assert (preset.nodes, preset.gpus_per_node) == (grammar.nodes, grammar.gpus_per_node)
    assert preset.network == grammar.network
    if preset.gpus_per_node > 1:
        assert preset.intra == grammar.intra


def test_preset_bandwidth_meaning():
    one_nic = load_topology("8x8-ib100")
    assert one_nic.network.nics_per_node == 1 and one_nic.node_bandwidth == pytest.approx(12.5e9)
    eight = load_topology("8x8-ib400x8")
    assert eight.network.bandwidth_per_nic == pytest.approx(50e9)
    assert eight.node_bandwidth == pytest.approx(400e9)
    assert load_topology("128x8-ib400x8").ranks == 1024


@given(st.integers(1, 512), st.integers(1, 16), st.sampled_from(["ib", "roce", "eth"]),
       st.integers(1, 800), st.data())
def test_grammar_round_trip(nodes, gpus, fabric, gbps, data):
    nics = data.draw(st.one_of(st.none(), st.integers(1, gpus)))
    name = f"{nodes}x{gpus}-{fabric}{gbps}" + (f"x{nics}" if nics else "")
    if nodes * gpus < 2:
        with pytest.raises(TopologyError):
            from_name(name)
        return
    t = from_name(name)
    assert (t.nodes, t.gpus_per_node, t.network.nics_per_node) == (nodes, gpus, nics or 1)
    assert t.network.bandwidth_per_nic == pytest.approx(gbps * 1e9 / 8)
    assert load_topology(name).ranks == nodes * gpus


@given(st.text(min_size=1, max_size=20))
def test_unknown_names_raise_topology_error(text):
    try:
        load_topology(text)
    except TopologyError as exc:
        assert "\n" not in str(exc)
    except OSError:
        pass  # a name the OS cannot stat at all


def test_unknown_name_lists_presets_and_grammar():
    with pytest.raises(TopologyError) as info:
        load_topology("9x9-warp")
    assert "8x8-ib100" in str(info.value) and "NxG" in str(info.value)


def _write(tmp_path, body: dict | str):
    path = tmp_path / "t.yaml"
    path.write_text(body if isinstance(body, str) else yaml.safe_dump(body))
    return str(path)


GOOD = {"name": "custom", "nodes": 2, "gpus_per_node": 4,
        "intra": {"kind": "nvlink", "bandwidth": "300GB/s", "latency": "3us"},
        "network": {"kind": "ib", "nics_per_node": 2, "bandwidth_per_nic": "100Gbps", "latency": "5us"}}


def test_yaml_file_loads(tmp_path):
    t = load_topology(_write(tmp_path, GOOD))
    assert t.ranks == 8 and t.network.nics_per_node == 2 and t.intra.bandwidth == 300e9


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["network"].pop("latency"), "network.latency' is missing"),
    (lambda d: d.pop("network"), "'network' is missing"),
    (lambda d: d["network"].update(bandwidth_per_nic="0Gbps"), "positive bandwidth"),
    (lambda d: d["network"].update(bandwidth_per_nic="fast"), "network.bandwidth_per_nic"),
    (lambda d: d.update(nodes=1, gpus_per_node=1), "at least 2 ranks"),
    (lambda d: d["network"].update(nics_per_node=9), "nics_per_node"),
    (lambda d: d["network"].update(fabric="torus"), "fabric"),
    (lambda d: d["network"].update(fabric="fat-tree"), "nodes_per_leaf"),
    (lambda d: d.update(colour="blue"), "unknown field 'colour'"),
    (lambda d: d.update(stragglers={7: 0.5}), "slowdown"),
    (lambda d: d.update(stragglers={99: 1.5}), "outside"),
    (lambda d: d.update(nodes="two"), "whole number"),
])
def test_bad_yaml_names_the_field_and_file(tmp_path, change, message):
    body = yaml.safe_load(yaml.safe_dump(GOOD))
    change(body)
    path = _write(tmp_path, body)
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    assert message in str(info.value)
    assert "t.yaml" in str(info.value)


def test_malformed_yaml(tmp_path):
    with pytest.raises(TopologyError, match="malformed YAML at line"):
        load_topology(_write(tmp_path, "nodes: [1, 2\ngpus: {"))


def test_missing_yaml_file():
    with pytest.raises(TopologyError, match="does not exist"):
        load_topology("no/such/topology.yaml")


def test_fat_tree_uplink_and_paths():
    t = load_topology("16x8-ib200-ft2")
    assert t.uplink_bandwidth == pytest.approx(4 * 25e9 / 2)
    keys, _ = t.path(0, 8 * 4)  # node 0 -> node 4: different leaves
    assert ("up", 0) in keys and ("down", 1) in keys
    keys, _ = t.path(0, 8)  # node 0 -> node 1: same leaf
    assert all(k[0] in ("ntx", "nrx") for k in keys)


def test_rail_mapping_uses_one_nic_per_gpu_index():
    t = load_topology("8x8-ib400x8")
    keys, _ = t.path(3, 8 + 3)
    assert keys == (("ntx", 0, 3), ("nrx", 1, 3))


def test_more_nics_than_gpus_are_striped_into_one_rail_per_gpu(tmp_path):
    """A p5-class node (32 × 100 Gb/s EFA for 8 GPUs): four NICs to each GPU's rail, their bandwidths added, so it
    prices as eight 400 Gb/s rails; a count that is no whole multiple of the GPUs is one clear line."""
    from arcsim.pricing import price_collective

    p5 = from_name("2x8-eth100x32-h100-nvlink")
    rails = from_name("2x8-eth400x8-h100-nvlink")
    assert (p5.network.nics_per_node, p5.network.nics_per_rail, p5.network.physical_nics) == (8, 4, 32)
    assert p5.network.bandwidth_per_nic == pytest.approx(4 * 100e9 / 8)
    assert p5.node_bandwidth == pytest.approx(32 * 100e9 / 8)
    shown = p5.to_dict()["network"]
    assert (shown["nics_per_node"], shown["bandwidth_per_nic_Bps"], shown["rails_per_node"]) == (32, 100e9 / 8, 8)
    for n in (1e9,):  # smaller messages run on fewer of NCCL's channels, counted on the 32 NICs (nccl_tuning)
        for op in ("allreduce", "allgather"):
            (a,) = price_collective(p5, op, "auto", n, ("analytic",))
            (b,) = price_collective(rails, op, "auto", n, ("analytic",))
            assert a.time_s == pytest.approx(b.time_s), (op, n)
    with pytest.raises(TopologyError, match="nics_per_node 12 for 8 GPUs"):
        from_name("2x8-eth100x12")
    spec = {"nodes": 2, "gpus_per_node": 8, "intra": {"kind": "nvlink", "bandwidth": "450GB/s", "latency": "3us"},
            "network": {"kind": "ethernet", "nics_per_node": 32, "bandwidth_per_nic": "100Gbps", "latency": "30us"}}
    path = tmp_path / "p5.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert load_topology(str(path)).network.physical_nics == 32


@pytest.mark.parametrize("field, value, says", [("mtu", 100, "network.mtu"), ("efficiency", 0, "network.efficiency"),
                                                ("efficiency", 3, "network.efficiency"),
                                                ("crossing_us", -1, "network.crossing_us")])
def test_a_networks_calibrated_and_socket_fields_are_checked_on_any_fabric(tmp_path, field, value, says):
    path = tmp_path / "t.yaml"
    path.write_text("nodes: 2\ngpus_per_node: 1\nnetwork: {kind: tcp, nics_per_node: 1, bandwidth_per_nic: 10Gbps, "
                    f"latency: 30us, {field}: {value}}}\n")
    with pytest.raises(TopologyError, match=says):
        load_topology(str(path))
    path.write_text(path.read_text().replace(f"{field}: {value}", "mtu: 9000, efficiency: 0.8, crossing_us: 12"))
    net = load_topology(str(path)).to_dict()["network"]
    assert (net["mtu"], net["efficiency"], net["crossing_us"]) == (9000, 0.8, 12)
