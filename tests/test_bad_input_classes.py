"""Bad input by class (issue 26): every kind of value has one validated parse, so each class below fails the
same way wherever it is given — one `error:` line, exit 2, no traceback, nothing left in the working folder.

The cases run the console entry's error handling in this process (``invoke``), which is what the real
entry point does after its start-up; tests/test_bad_input.py runs a sample of them through a subprocess."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import zipfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from arcsim.files import packaged

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "reports" / "validation.csv"  # a validation report arcsim validate wrote
SHIPPED_TRACE = packaged("traces", "cnn-digits-small.npz")
SHIPPED_PROFILE = packaged("traces", "profiles", "cnn-h100-b32-fp32.json")
PRESET = packaged("topologies", "8x1-eth10.yaml")
BOMB = "".join(f"{c}: &{c} [{', '.join(['*' + p] * 9 if p else ['x'] * 9)}]\n"
               for p, c in zip(["", *"abcdefg"], "abcdefgh", strict=True))
SCHEDULE = "name: s\nunit: step\nphases:\n  - {start: 0, latency: 1ms, bandwidth: 25Gbps}\n"


def invoke(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``arcsim ARGS`` as the console entry does (arcsim.cli.main.main), here; (exit code, stdout, stderr)."""
    from arcsim.cli.common import Verbosity
    from arcsim.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    old_argv, old_cwd, old_env = sys.argv, os.getcwd(), dict(os.environ)
    sys.argv = ["arcsim", *args]
    os.environ.update(env or {})
    os.chdir(cwd)
    Verbosity.quiet = False
    code = 0
    try:
        with redirect_stdout(out), redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
    return code, out.getvalue(), err.getvalue()


def trace_with(path: Path, meta_changes: dict | None = None, corrupt: bool = False) -> Path:
    """A copy of the shipped trace with its metadata changed, or a byte range of its gradients overwritten."""
    with zipfile.ZipFile(SHIPPED_TRACE) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "metadata.npy" and meta_changes:
                meta = json.loads(np.load(io.BytesIO(data)).tobytes())
                meta.update(meta_changes)
                buf = io.BytesIO()
                np.save(buf, np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8))
                data = buf.getvalue()
            dst.writestr(info.filename, data)
    if corrupt:
        raw = bytearray(path.read_bytes())
        at = raw.index(b"NUMPY") + 4096
        raw[at:at + 64] = bytes(range(64))
        path.write_bytes(bytes(raw))
    return path


# a validation report's row 2 (line 3) with one value outside its domain
REPORT_FAULTS: dict[str, tuple[str, object]] = {
    "per_node_above_ranks": ("ranks_per_node", 8), "spread_reversed": ("spread_min", 1e3),
    "density_2": ("density", 2.0), "hierarchy_empty": ("hierarchy", ""), "hierarchy_unknown": ("hierarchy", "rack")}


def report_with(column: str, value: object) -> str:
    """The committed validation report with ``column`` of its second row set to ``value``."""
    import csv

    rows = list(csv.reader(io.StringIO(REPORT.read_text())))
    rows[2][rows[0].index(column)] = str(value)
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def files(tmp: Path) -> dict[str, Path]:
    """Every malformed file the cases name, made in ``tmp/in`` (outside the working folder they run in)."""
    d = tmp / "in"
    d.mkdir()
    text = PRESET.read_text()
    made = {
        "binary": b"\x80\x81\xfe\xff" * 64, "list_yaml": "- a\n- b\n", "list_json": "[1, 2]", "str_json": '"abc"',
        "bomb": BOMB, "dup_topology": text + "nodes: 4\n",
        "topo_gamma_nan": text + "gamma: .nan\n", "topo_jitter_inf": text + "jitter: .inf\n",
        "topo_bomb_name": BOMB + text.replace("name: 8x1-eth10", "name: *h"),
        "topo_oversub_nan": text.replace("fabric: switch", "fabric: fat-tree\n  nodes_per_leaf: 2\n"
                                         "  oversubscription: .nan"),
        "topo_calib_zero": text + "calibration:\n  allreduce: {latency: 10us, bandwidth: 0Gbit}\n",
        "sched_unknown_key": SCHEDULE.replace("bandwidth:", "bandwith:"),
        "sched_dup": SCHEDULE + "unit: step\n", "sched_bomb": BOMB + SCHEDULE.replace("name: s", "name: *h"),
        "sched_list": "- 1\n", "sched_nan": SCHEDULE.replace("1ms", ".nan"),
        "sweep_bomb_axis": BOMB + "density: *h\n", "sweep_list": "- 1\n", "sweep_dup": "density: 0.1\ndensity: 0.2\n",
        "sweep_seed_frac": "seed: 2.7\n", "sweep_seed_neg": "seed: -1\n",
        "sweep_ranks_huge": "ranks: [1000000000]\n", "sweep_live_setting": "live_workers: 4\n",
        "sweep_brace_huge": "topology: " + "-".join(["8x8-ib{" + ",".join(map(str, range(1, 11))) + "}"] * 1)
                            + "\nbandwidth: " + ",".join(f"{b}Gbit" for b in range(1, 1001)) + "\nlatency: "
                            + ",".join(f"{u}us" for u in range(1, 1001)) + "\ndensity: "
                            + ",".join(f"{x / 1e4:g}" for x in range(1, 1001)) + "\n",
        "profile_negative": SHIPPED_PROFILE.read_text().replace('"forward_s": ', '"forward_s": -'),
        "profile_nan": re.sub(r'"backward_s": [0-9.e-]+', '"backward_s": NaN', SHIPPED_PROFILE.read_text()),
        "results_header_only": "point_id,compressor,iteration_s\n",
        "topo_gpus_zero": text.replace("gpus_per_node: 1", "gpus_per_node: 0"),
        "topo_nodes_negative": text.replace("nodes: 8", "nodes: -2"),
        "topo_nics_zero": text.replace("nics_per_node: 1", "nics_per_node: 0"),
        "topo_leaf_zero": text.replace("fabric: switch", "fabric: fat-tree\n  nodes_per_leaf: 0"),
        "topo_calib_ranks_zero": text + "calibration:\n  allreduce: {latency: 10us, bandwidth: 1Gbit, ranks: 0}\n",
        "sweep_bucket_inf": "bucket_mb: .inf\n", "sweep_bucket_list": "bucket_mb: [25, .nan]\n",
        "sweep_bucket_bool": "bucket_mb: true\n",
        **{f"report_{name}": report_with(column, value) for name, (column, value) in REPORT_FAULTS.items()},
    }
    out = {}
    for name, body in made.items():
        suffix = (".json" if "json" in name or name.startswith("profile") else
                  ".csv" if "results" in name or name.startswith("report") else ".yaml")
        path = d / f"{name}{suffix}"
        (path.write_bytes if isinstance(body, bytes) else path.write_text)(body)
        out[name] = path
    (d / "folder").mkdir()
    out["folder"] = d / "folder"
    out["binary_json"] = out["binary"].rename(d / "binary.json")
    out["binary_yaml"] = d / "binary.yaml"
    out["binary_yaml"].write_bytes(b"\x80\x81\xfe\xff" * 64)
    sweep_dir = d / "sweep_bad_record"
    sweep_dir.mkdir()
    (sweep_dir / "sweep.yaml").write_bytes(b"\x80\x81")
    (sweep_dir / "results.csv").write_text("point_id,compressor,iteration_s\n1,dense,0.1\n")
    out["sweep_bad_record"] = sweep_dir
    plot_dir = d / "plot_binary"
    plot_dir.mkdir()
    (plot_dir / "results.csv").write_bytes(b"\x80\x81\xfe\xff" * 64)
    out["plot_binary"] = plot_dir
    header_dir = d / "plot_header"
    header_dir.mkdir()
    (header_dir / "results.csv").write_text("point_id,compressor,iteration_s\n")
    out["plot_header"] = header_dir
    for name, change in {"meta_steps_str": {"steps": "abc"}, "meta_workers_null": {"workers": None},
                         "meta_recorded_int": {"recorded_steps": 5}, "meta_workers_float": {"workers": 8.5},
                         "meta_model_list": {"model": ["cnn"]}}.items():
        out[name] = trace_with(d / f"{name}.npz", change)
    out["trace_corrupt"] = trace_with(d / "trace_corrupt.npz", corrupt=True)
    out["readonly_cache"] = d / "cache-is-a-file"
    out["readonly_cache"].write_text("x")
    return out


# (class, arguments, a phrase the error line must hold). {name} is a file made by ``files``.
CASES: list[tuple[str, list[str], str]] = [
    # counts given as nan / inf / negative / fractions
    *[("count", args, phrase) for args, phrase in [
        (["train", "--steps", "nan"], "not a finite number"), (["train", "-w", "inf"], "not a finite number"),
        (["train", "--eval-every", "-3"], "at least 1"), (["train", "--warmup", "nan"], "not a finite number"),
        (["compress", "--synthetic", "normal", "-n", "nan"], "not a finite number"),
        (["compress", "--synthetic", "normal", "-w", "inf"], "not a finite number"),
        (["compress", "--synthetic", "normal", "-s", "-1"], "at least 1"),
        (["compress", "--rank", "nan"], "not a finite number"),
        (["trace", "capture", "--model", "mlp", "--steps", "inf"], "not a finite number"),
        (["trace", "capture", "--model", "mlp", "--warmup", "nan"], "not a finite number"),
        (["trace", "capture", "--model", "mlp", "--every", "0"], "at least 1"),
        (["trace", "capture", "--model", "mlp", "-w", "1e9"], "at most 1,024"),
        (["trace", "profile", "--model", "mlp", "-b", "2.5"], "not a whole number"),
        (["calibrate", "--loopback", "-p", "nan"], "not a finite number"),
        (["calibrate", "--loopback", "-p", "2", "--repeats", "0"], "at least 1"),
        (["validate", "--steps", "inf"], "not a finite number"), (["validate", "--repeats", "nan"], "finite"),
        (["cluster", "up", "-p", "nan"], "not a finite number"),
        (["run", "--live", "--workers", "nan"], "not a finite number"), (["run", "--grid-steps", "0"], "at least 1"),
        (["run", "--grid-steps", "-1"], "at least 1"), (["run", "--layers", "0"], "at least 1"),
        (["run", "--seed", "inf"], "not a finite number"), (["collective", "--chunks", "nan"], "finite"),
        (["device", "predict", "--model", "cnn", "--gpu", "h100", "-b", "nan"], "not a finite number"),
        (["sweep", "--live-steps", "nan", "-o", "sw"], "not a finite number"),
        (["train", "--seeds", "-1", "--steps", "1"], "--seeds"), (["train", "--seeds", "0,0", "--steps", "1"], "twice"),
        (["train", "--seeds", "1.5", "--steps", "1"], "--seeds"),
    ]],
    # numbers that are not finite or mean nothing
    *[("number", args, phrase) for args, phrase in [
        (["run", "--density", "nan"], "not a finite number"), (["run", "--density", "0"], "must lie in (0, 1]"),
        (["run", "--density", "1.5"], "must lie in (0, 1]"), (["run", "--slack", "inf"], "not a finite number"),
        (["run", "--bucket-mb", "nan"], "not a finite number"), (["run", "--bucket-mb", "0"], "must lie in (0, 1e+06]"),
        (["run", "--weights", "nan,1"], "--weights"), (["run", "--weights", "-1,1"], "--weights"),
        (["run", "--weights", "1"], "--weights"), (["run", "--ratios", "nan,0.1"], "--ratios"),
        (["run", "--ratios", "0,0.1"], "--ratios"), (["run", "--params", "1.4"], "whole number"),
        (["run", "--params", "nan"], "not a parameter count"), (["run", "--params", "inf"], "not a parameter count"),
        (["train", "--lr", "nan"], "not a finite number"), (["train", "--lr", "0"], "greater than 0"),
        (["train", "--target", "inf"], "not a finite number"), (["train", "--density", "-0.1"], "must lie in (0, 1]"),
        (["compress", "--synthetic", "correlated", "--shared", "nan"], "not a finite number"),
        (["collective", "--size", "0.5B"], "below one byte"), (["collective", "--size", "nanB"], "cannot read size"),
        (["collective", "--compute", "1e400s"], "not finite"),
        (["sweep", "-d", "nan", "-o", "sw"], "density"), (["sweep", "--ranks", "0", "-o", "sw"], "ranks"),
        (["sweep", "-b", "0Gbit", "-o", "sw"], "bandwidth"),
        (["run", "-t", "{topo_gamma_nan}"], "gamma"), (["run", "-t", "{topo_jitter_inf}"], "jitter"),
        (["topo", "show", "{topo_oversub_nan}"], "oversubscription"),
        (["topo", "show", "{topo_calib_zero}"], "bandwidth"),
        (["run", "--compute-profile", "{profile_negative}"], "negative"),
        (["run", "--compute-profile", "{profile_nan}"], "not finite"),
        (["run", "--network-schedule", "{sched_nan}"], "latency"),
        *[(["sweep", "--bucket-mb", v, "-o", "sw"], "bucket_mb: cannot use") for v in ("inf", "nan", "-1", "0")],
        *[(["sweep", f"{{sweep_bucket_{v}}}", "-o", "sw"], "bucket_mb: cannot use") for v in ("inf", "list", "bool")],
    ]],
    # count fields of a topology or instance file (and of the name grammar): whole numbers ≥ 1, named with the file
    *[("topology count", args, phrase) for args, phrase in [
        (["topo", "show", "{topo_gpus_zero}"], "field 'gpus_per_node' must be a whole number ≥ 1 (got 0)"),
        (["run", "-t", "{topo_gpus_zero}"], "topo_gpus_zero.yaml: field 'gpus_per_node'"),
        (["topo", "show", "{topo_nodes_negative}"], "field 'nodes' must be a whole number ≥ 1 (got -2)"),
        (["topo", "show", "{topo_nics_zero}"], "field 'network.nics_per_node' must be a whole number ≥ 1"),
        (["topo", "show", "{topo_leaf_zero}"], "field 'network.nodes_per_leaf' must be a whole number ≥ 1"),
        (["topo", "show", "{topo_calib_ranks_zero}"], "field 'calibration.allreduce.ranks' must be a whole number"),
        (["topo", "show", "8x0-eth10"], "gpus_per_node must be a whole number ≥ 1 (got 0)"),
        (["collective", "-t", "8x0-ib100"], "gpus_per_node must be a whole number ≥ 1"),
        (["topo", "show", "0xp5"], "has 0 nodes"),
    ]],
    # rows of a validation report outside their domain: the line, the column and what to give
    *[("report row", ["validate", "--report", f"{{report_{name}}}"], f"line 3, column {column}")
      for name, (column, _) in REPORT_FAULTS.items()],
    # files that are not text, not the expected type, or a folder
    *[("file", args, phrase) for args, phrase in [
        (["run", "--network-schedule", "{binary_yaml}"], "not a text file"),
        (["run", "--network-schedule", "{folder}"], "directory"),
        (["train", "--network-schedule", "{sched_list}", "--steps", "1"], "mapping"),
        (["sweep", "{binary_yaml}", "-o", "sw"], "not a text file"), (["sweep", "{folder}", "-o", "sw"], "directory"),
        (["sweep", "{sweep_list}", "-o", "sw"], "mapping"),
        (["sweep", "-d", "0.1", "-o", "{sweep_bad_record}"], "not a text file"),
        (["plot", "{plot_binary}"], "not a sweep results table"), (["plot", "{plot_header}"], "no finished points"),
        (["plot", "{results_header_only}"], "no finished points"),
        (["run", "--compute-profile", "{folder}"], "directory"),
        (["run", "--compute-profile", "{list_json}"], "not an object"),
        (["run", "--compute-profile", "{str_json}"], "not an object"),
        (["run", "--compute-profile", "{binary_json}"], "not a text file"),
        (["run", "-t", "{binary_yaml}"], "not a text file"), (["run", "-t", "{list_yaml}"], "mapping"),
        (["run", "-t", ""], "empty"), (["run", "--trace", "{folder}"], "directory"),
        (["run", "--trace", "{binary_json}"], "not a trace"),
        (["compress", "--trace", "{in}/missing/cnn-digits-small.npz"], "no such trace file"),
        (["run", "-c", "dense", "--policy", "none"], "cannot write"),  # with an unwritable ARCSIM_CACHE_DIR
    ]],
    # trace metadata of the wrong type, and stored gradients that do not match their checksum
    *[("trace", args, phrase) for args, phrase in [
        (["trace", "info", "{meta_steps_str}"], "steps"), (["run", "--trace", "{meta_workers_null}"], "workers"),
        (["compress", "--trace", "{meta_recorded_int}"], "recorded_steps"),
        (["trace", "info", "{meta_workers_float}"], "workers"), (["trace", "info", "{meta_model_list}"], "model"),
        (["sweep", "--trace", "{meta_steps_str}", "-o", "sw"], "steps"),
        (["compress", "--trace", "{trace_corrupt}"], "checksum"), (["run", "--trace", "{trace_corrupt}"], "checksum"),
    ]],
    # sizes past what this machine can hold: refused up front with the estimate
    *[("size", args, phrase) for args, phrase in [
        (["run", "-t", "1000000000x8-ib100"], "ranks"), (["collective", "-t", "1000000000x8-ib100"], "ranks"),
        (["topo", "show", "100000000x8-ib100"], "ranks"), (["sweep", "{sweep_ranks_huge}", "-o", "sw"], "ranks"),
        (["trace", "capture", "--model", "cnn", "--input-size", "100000"], "at most 4,096"),
        (["sweep", "{sweep_brace_huge}", "-o", "sw", "--dry-run"], "points"),
    ]],
    # keys and flags that would be ignored
    *[("ignored", args, phrase) for args, phrase in [
        (["run", "--network-schedule", "{sched_unknown_key}"], "bandwith"),
        (["run", "--network-schedule", "{sched_dup}"], "twice"), (["run", "-t", "{dup_topology}"], "twice"),
        (["sweep", "{sweep_dup}", "-o", "sw"], "twice"), (["run", "--steps", "5"], "--live"),
        (["run", "--workers", "4"], "--live"), (["run", "--device", "cuda"], "--live"),
        (["run", "--model", "cnn"], "--live"), (["sweep", "{sweep_live_setting}", "-o", "sw"], "live"),
        (["sweep", "--live-workers", "4", "-o", "sw"], "live"),
        (["run", "--gpu", "cpu", "--precision", "bf16"], "bf16"),
        (["run", "--gpu", "cpu", "--batch", "64"], "--batch"),
        (["run", "--policy", "paper", "--slack", "0.5"], "--slack sets --policy gate's error limit"),
        (["run", "--slack", "0.1"], "--policy auto has none"),
        (["shard", "--model", "cnn", "-t", "8x1-eth10", "--quantize", "none+int8"], "none stands alone"),
        (["shard", "--model", "cnn", "-t", "8x1-eth10", "--quantize", "int8+none,zeropp"], "none stands alone"),
        (["shard", "--model", "cnn", "-t", "8x1-eth10", "--quantize", "zeropp+hpz"], "hpz with two tokens"),
    ]],
    # YAML alias bombs
    *[("alias", args, phrase) for args, phrase in [
        (["run", "-t", "{bomb}"], "aliases"), (["topo", "show", "{topo_bomb_name}"], "aliases"),
        (["run", "--network-schedule", "{sched_bomb}"], "aliases"), (["sweep", "{sweep_bomb_axis}", "-o", "sw"],
                                                                      "aliases"),
    ]],
    # messages
    *[("message", args, phrase) for args, phrase in [
        (["run", "-t", "8x8-ib100-X100"], "unknown gpu 'x100'"), (["run", "--csv", "-"], "--csv"),
        (["run", "--trace", ""], "empty"), (["collective", "-t", " "], "topology"),
        (["shard", "--model", "cnn", "-t", "8x1-eth10", "--quantize", "hpz"], "one GPU per node, and hpZ"),
        (["shard", "--model", "cnn", "-t", "8x1-eth10", "--sharding", "full", "--quantize", "zeropp"],
         "one GPU per node, and hpZ"),
    ]],
]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return files(tmp_path_factory.mktemp("bad-input"))


@pytest.mark.parametrize(("kind", "args", "phrase"), CASES, ids=[f"{k}: {' '.join(a)}" for k, a, _ in CASES])
def test_bad_input_class_is_one_error_line(tmp_path: Path, made: dict[str, Path], kind: str, args: list[str],
                                           phrase: str):
    cwd = tmp_path / "work"
    cwd.mkdir()
    argv = [a.format(**made, **{"in": made["folder"].parent}) for a in args]
    env = {"ARCSIM_CACHE_DIR": str(made["readonly_cache"] / "sub")} if "cannot write" in phrase else None
    code, _, err = invoke(argv, cwd, env)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (code, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    assert phrase.lower() in lines[0].lower(), lines[0]
    assert "Traceback" not in err
    assert list(cwd.iterdir()) == []  # nothing written


def test_no_command_prints_the_usage_not_an_error():
    code, out, err = invoke([], Path.cwd())
    assert code == 0 and "Usage:" in out and not err.startswith("error:")


def test_yaml_aliases_within_the_bound_are_read(tmp_path: Path):
    from arcsim.errors import ArcsimError
    from arcsim.files import parse_yaml

    assert parse_yaml("a: &x [1, 2]\nb: *x\n", "f", ArcsimError) == {"a": [1, 2], "b": [1, 2]}
    with pytest.raises(ArcsimError, match="aliases"):
        parse_yaml(BOMB, "f", ArcsimError)


@pytest.mark.parametrize(("field", "value"), [("gpus_per_node", "0"), ("gpus_per_node", "-8"),
                                              ("nics_per_node", "0")])
def test_an_instance_file_count_is_a_whole_number_of_at_least_one(tmp_path: Path, field: str, value: str):
    """A node type of one's own (instances/<name>.yaml on $ARCSIM_TOPOLOGY_PATH) with a count of 0 or below: one
    error naming the field and the file (gpus_per_node 0 was a ZeroDivisionError)."""
    (tmp_path / "instances").mkdir()
    text = packaged("topologies", "instances", "p5.yaml").read_text()
    mine = tmp_path / "instances" / "mine.yaml"
    mine.write_text(re.sub(rf"{field}: \d+", f"{field}: {value}", text))
    cwd = tmp_path / "work"
    cwd.mkdir()
    code, _, err = invoke(["topo", "show", "2xmine"], cwd, {"ARCSIM_TOPOLOGY_PATH": str(tmp_path)})
    prefix = "network." if field == "nics_per_node" else ""
    assert code == 2 and err.strip() == (f"error: {mine}: field '{prefix}{field}' must be a whole number ≥ 1 "
                                         f"(got {value})"), err

