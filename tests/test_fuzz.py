"""Fuzzing the parsers a user types into: only ArcsimError (one line, exit 2) may come out (issue 13)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from arcsim.errors import ArcsimError
from arcsim.topology import load_yaml
from arcsim.units import parse_duration, parse_rate, parse_size

UNITISH = st.one_of(st.text(max_size=12),
                    st.builds(lambda n, u: f"{n}{u}", st.floats(allow_nan=True, allow_infinity=True),
                              st.sampled_from(["B", "kB", "MiB", "GB", "Gbps", "Gbit", "us", "ms", "s", "", "x"])))


@settings(max_examples=300)
@given(UNITISH)
def test_unit_parsers_raise_only_arcsim_errors(text):
    for parse in (parse_size, parse_rate, parse_duration):
        try:
            value = parse(text)
        except ArcsimError:
            continue
        assert isinstance(value, float)


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(), st.text(max_size=8))
YAML_VALUES = st.recursive(SCALARS,
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.sampled_from(
                                                       ["name", "nodes", "gpus_per_node", "intra", "network",
                                                        "bandwidth", "latency", "kind", "nics_per_node",
                                                        "bandwidth_per_nic", "fabric", "nodes_per_leaf",
                                                        "oversubscription", "x"]), inner, max_size=5)),
                           max_leaves=12)


@settings(max_examples=300)
@given(st.one_of(YAML_VALUES, st.text(max_size=40)))
def test_topology_yaml_raises_only_arcsim_errors(value):
    import yaml

    text = value if isinstance(value, str) else yaml.safe_dump(value)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.yaml"
        path.write_text(text)
        with contextlib.suppress(ArcsimError):
            load_yaml(path)


SWEEP_KEYS = ["topology", "bandwidth", "latency", "ranks", "trace", "compressor", "density", "bucket_mb", "engine",
              "memory", "seed", "x"]


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(SWEEP_KEYS), YAML_VALUES, max_size=4))
def test_sweep_spec_raises_only_arcsim_errors(raw):
    from arcsim.sweep.spec import build_spec

    with contextlib.suppress(ArcsimError):
        build_spec(raw, source="fuzz").points()
