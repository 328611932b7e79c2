"""`arcsim topo` and `arcsim collective` as a user runs them: JSON shape, and one-line errors with exit 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from arcsim.units import parse_size

STRAGGLER = str(Path(__file__).resolve().parents[1] / "examples/topologies/8x1-eth10-straggler.yaml")
KEYS = {"op", "algo", "engine", "ranks", "bytes", "time_s", "algbw_Bps", "busbw_Bps"}


def test_collective_json_single_engine():
    r = run_cli("collective", "--topology", "8x1-eth10", "--op", "allreduce", "--algo", "ring",
                "--size", "100MB", "--json", "-")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= KEYS
    assert out["bytes"] == 1e8 and out["ranks"] == 8 and out["engine"] == "analytic"
    assert out["algbw_Bps"] == pytest.approx(out["bytes"] / out["time_s"])
    assert out["busbw_Bps"] == pytest.approx(out["algbw_Bps"] * 2 * 7 / 8)


def test_collective_json_both_engines_is_a_list():
    r = run_cli("collective", "-t", "4x8-roce100", "--op", "allgather", "--algo", "hierarchical",
                "--size", "64MiB", "--engine", "both", "--json", "-", "--library", "ideal")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["engine"] for row in rows] == ["analytic", "des"]
    assert all(row["bytes"] == 64 * 2**20 for row in rows)
    assert rows[0]["time_s"] == pytest.approx(rows[1]["time_s"], rel=0.01)
    assert rows[1]["busbw_Bps"] == pytest.approx(rows[1]["algbw_Bps"] * 31 / 32)


def test_auto_reports_its_choice_and_all_lists_every_algorithm():
    for library, offered in (("ideal", {"ring", "tree", "rhd", "rd", "binomial", "hierarchical"}),
                             ("nccl", {"ring", "tree"}), ("gloo", {"ring", "rhd"})):
        auto = json.loads(run_cli("collective", "--json", "-", "--library", library).stdout)
        every = json.loads(run_cli("collective", "--algo", "all", "--json", "-", "--library", library).stdout)
        assert auto["auto"] is True and auto["library"] == library
        if library == "gloo":  # a rule, not a search: gloo runs its ring even where halving-doubling is cheaper
            assert auto["algo"] == "ring"
        else:
            assert auto["time_s"] == pytest.approx(min(row["time_s"] for row in every))
        assert {row["algo"] for row in every} == offered


def test_every_preset_op_and_algorithm_answers_with_both_engines():
    listing = json.loads(run_cli("topo", "list", "--json", "-").stdout)
    names = [t["name"] for t in listing if t["kind"] == "preset" and t["ranks"] <= 128]  # 1,024: test_engines
    for name in names:
        for op in ("allreduce", "allgather", "broadcast", "reducescatter"):
            r = run_cli("collective", "-t", name, "--op", op, "--algo", "all", "--engine", "both",
                        "--size", "1MB", "--json", "-")
            assert r.returncode == 0, (name, op, r.stderr)
            rows = json.loads(r.stdout)
            assert all(row["time_s"] > 0 for row in rows)


def test_topo_show_json_and_table():
    r = run_cli("topo", "show", "8x8-ib400x8", "--json", "-")
    info = json.loads(r.stdout)
    assert info["ranks"] == 64 and info["network"]["nics_per_node"] == 8
    assert info["network"]["bandwidth_per_nic_Bps"] == pytest.approx(50e9)
    table = run_cli("topo", "show", "8x8-ib100")
    assert table.returncode == 0 and "1 NIC(s) per node" in table.stdout


@pytest.mark.parametrize(("args", "fragment"), [
    (("collective", "-t", "nowhere"), "unknown topology"),
    (("collective", "--size", "100 MiB"), "space"),
    (("collective", "--size", "1e6"), "unit"),
    (("collective", "--size", "12XB"), "cannot read size"),
    (("collective", "--op", "scatter"), "unknown collective"),
    (("collective", "--op", "broadcast", "--algo", "ring"), "nccl has no ring broadcast"),
    (("collective", "--algo", "bogus"), "Invalid value"),
    (("topo", "show", "missing.yaml"), "does not exist"),
])
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    r = run_cli(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(("yaml_text", "fragment"), [
    ("nodes: 1\ngpus_per_node: 1\nnetwork: {kind: eth, bandwidth_per_nic: 1Gbps, latency: 1us}\n", "2 ranks"),
    ("nodes: 4\ngpus_per_node: 1\nnetwork: {kind: eth, bandwidth_per_nic: 0Gbps, latency: 1us}\n", "positive"),
    ("nodes: 4\ngpus_per_node: 1\nnetwork: {kind: eth, latency: 1us}\n", "bandwidth_per_nic' is missing"),
    ("nodes: [4\n", "malformed YAML"),
])
def test_bad_topology_files(tmp_path, yaml_text, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    r = run_cli("collective", "-t", str(path))
    assert r.returncode == 2 and fragment in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_debug_shows_the_traceback():
    r = run_cli("--debug", "collective", "-t", "nowhere")
    assert r.returncode == 2 and "Traceback" in r.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_and_debug_go_before_the_command_or_after_it(tmp_path, where):
    """`arcsim run -q` had been 'No such option' with no hint that -q goes first."""
    def argv(flag: str, *command: str) -> list[str]:
        return [flag, *command] if where == "before" else [*command, flag]

    out = tmp_path / "t.json"
    r = run_cli(*argv("-q", "topo", "list", "--json", str(out)))
    assert r.returncode == 0 and r.stderr == "" and json.loads(out.read_text())  # no 'wrote' note
    r = run_cli(*argv("--quiet", "trace", "info", "--json", "-"))  # in a nested group too
    assert r.returncode == 0 and r.stderr == "" and json.loads(r.stdout)
    r = run_cli(*argv("--debug", "collective", "-t", "nowhere"))
    assert r.returncode == 2 and "Traceback" in r.stderr


def test_topo_list_shows_the_instance_types_too():
    from arcsim.topology import instance_names

    listing = json.loads(run_cli("topo", "list", "--json", "-").stdout)
    instances = {t["name"]: t for t in listing if t["kind"] == "instance"}
    assert set(instances) == set(instance_names()) >= {"p5", "dgx-h100", "nd-h100-v5"}
    p5 = instances["p5"]
    assert p5["usage"] == "<N>xp5" and p5["gpus_per_node"] == 8 and p5["gpu"] == "h100"
    assert p5["node_bandwidth_Bps"] == pytest.approx(3.2e12 / 8)
    assert {t["kind"] for t in listing} == {"preset", "instance"} and listing[0]["kind"] == "preset"
    table = " ".join(run_cli("topo", "list", env={"COLUMNS": "120"}).stdout.split())
    assert "Instance types" in table and "AWS p5.48xlarge" in table and "4xp5, 2xdgx-h100" in table


def test_straggler_example_shows_in_the_des_only():
    rows = json.loads(run_cli("collective", "-t", STRAGGLER, "--algo", "ring",
                              "--engine", "both", "--compute", "40ms", "--json", "-").stdout)
    analytic, des = rows
    assert des["time_s"] >= analytic["time_s"] + 0.5 * 0.040 * 0.999


def test_help_mentions_unit_conventions():
    r = run_cli("collective", "--help")
    assert r.returncode == 0 and "MiB = 2^20" in r.stdout and "MB = 10^6" in r.stdout
    assert parse_size("1MiB") == 2**20


COMPUTING = [("collective",), ("compress",), ("run",), ("sweep",), ("plot",), ("train",), ("calibrate",),
             ("validate",), ("trace", "info"), ("topo", "list"), ("topo", "show")]


@pytest.mark.parametrize("path", COMPUTING, ids=" ".join)
def test_every_computing_command_takes_json_file_or_dash(path):
    from arcsim.cli.common import JsonTarget
    from arcsim.cli.main import cli

    command = cli
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    option = next(o for o in command.params if o.name == "json_out")
    assert isinstance(option.type, JsonTarget) and option.type.convert("-", None, None) == "-"


def test_json_dash_is_pure_json_on_stdout_and_quiet_silences_stderr(tmp_path):
    r = run_cli("--quiet", "collective", "--engine", "both", "--json", "-")
    assert r.returncode == 0 and r.stderr == ""
    assert {row["engine"] for row in json.loads(r.stdout)} == {"analytic", "des"}
    r = run_cli("collective", "--json", str(tmp_path / "c.json"))
    assert "allreduce" in r.stdout and json.loads((tmp_path / "c.json").read_text())["op"] == "allreduce"
    assert f"wrote {tmp_path / 'c.json'}" in r.stderr


def test_json_into_an_unwritable_place_is_refused_up_front():
    r = run_cli("collective", "--json", "/proc/x/c.json")
    assert r.returncode == 2 and r.stderr.startswith("error:") and "or - for stdout" in r.stderr


def test_work_past_the_limits_is_refused_at_once_unless_forced(monkeypatch):
    from arcsim.collectives import build, limits
    from arcsim.netsim import des
    from arcsim.topology import load_topology

    monkeypatch.setattr(limits, "STORED_MESSAGES", 10_000)
    monkeypatch.setattr(limits, "DES_EVENTS", 10_000)
    topo = load_topology("64x8-ib100")
    with pytest.raises(limits.TooMuchWork, match=r"tree allreduce on 512 ranks.*--force"):
        build("allreduce", "tree", 1e8, topo)
    with limits.allow_any():
        schedule = build("allreduce", "tree", 1e8, topo)
    assert schedule.message_count > 10_000
    with pytest.raises(limits.TooMuchWork, match="DES would process about"):
        des.simulate(schedule, topo)


@pytest.mark.parametrize("spec", ["64x8-ib100", "16x8-ib400x8", "8x1-ib100", "2x8-eth25"])
def test_a_des_too_large_is_refused_before_its_schedule_is_built(monkeypatch, spec):
    """The tree all-reduce's DES events, counted without building it, are those simulate() would refuse it for (its
    symmetry folded, or not where ranks arrive apart); past the limit for every protocol the refusal comes before any
    plan is built or priced, and at the limit for one of them there is none."""
    import numpy as np

    from arcsim import pricing
    from arcsim.collectives import build, limits
    from arcsim.errors import CollectiveError
    from arcsim.netsim import des
    from arcsim.topology import load_topology

    topo = load_topology(spec)
    apart = np.linspace(0.0, 1e-3, topo.ranks)
    fewest = {}
    for starts in (apart, None):
        least = float("inf")
        for way in pricing.plans(topo, "allreduce", "tree", 1e8):  # each protocol's, its chunk count its own
            links = way.choice.protocol.links(topo)
            folded = des._fold(way.schedule, links, np.zeros(topo.ranks) if starts is None else starts, True)
            simulated = des.expected_events(way.schedule, folded.reps)
            like = build("allreduce", "tree", 1e8, links, 1)
            assert des.expected_events(like, des.simulated_ranks(like, links, starts),
                                       way.schedule.message_count) == simulated
            least = min(least, simulated)
        fewest[starts is None] = least
        monkeypatch.setattr(limits, "DES_EVENTS", least)
        pricing.refuse_unsimulable(topo, "allreduce", "tree", 1e8, start_times=starts)  # the cheapest one may run
        monkeypatch.setattr(limits, "DES_EVENTS", least - 1)
        with pytest.raises(limits.TooMuchWork, match=f"tree allreduce on {topo.ranks:,} ranks: the DES would"):
            pricing.refuse_unsimulable(topo, "allreduce", "tree", 1e8, start_times=starts)
    assert fewest[True] <= fewest[False]  # folding never adds events
    with monkeypatch.context() as patched:  # (the limit is the folded run's, less one)
        patched.setattr(pricing, "plan", lambda *a, **k: pytest.fail("a plan was built before refusing"))
        for algo in ("tree", "all"):  # 'all': the ring, which may run, is not simulated only to be thrown away
            with pytest.raises(limits.TooMuchWork, match="the DES would process"):
                pricing.price_collective(topo, "allreduce", algo, 1e8, ("analytic", "des"))
    with pytest.raises(CollectiveError, match="chunk count must be between 1 and 64"):
        pricing.refuse_unsimulable(topo, "allreduce", "tree", 1e8, chunks=1000)


def test_long_des_runs_report_progress_with_the_estimate(monkeypatch):
    from arcsim.collectives import build, limits
    from arcsim.netsim import des
    from arcsim.topology import load_topology

    monkeypatch.setattr(limits, "PROGRESS_EVENTS", 1000)
    topo = load_topology("8x8-ib100")
    schedule = build("allreduce", "tree", 1e7, topo)
    seen: list[tuple[float, float]] = []
    result = des.simulate(schedule, topo, progress=lambda done, events: seen.append((done, events)))
    assert seen[0][0] == 0 and seen[-1][0] == 1 and len(seen) == 101
    assert 0.5 < seen[0][1] / result.events < 2  # the estimate is within 2× of the events processed
    assert result.time_s == des.simulate(schedule, topo).time_s  # running in slices changes nothing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's tunables")
def test_the_entry_point_restarts_once_with_glibc_keeping_freed_memory():
    """The restarted process sees the tunables (and does not restart again); tunables a user set for malloc
    are left alone; an interactive session or a program read from stdin is never started over."""
    from arcsim import processes

    code = ("import os; from arcsim.processes import restart_keeping_freed_memory as r; r(); "
            "print(os.environ.get('GLIBC_TUNABLES'))")
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [processes.KEEP_FREED]
    mine = {**env, "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    out = subprocess.run([sys.executable, "-c", code], env=mine, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["glibc.malloc.arena_max=2"]
    assert [processes._repeatable(a) for a in (["python"], ["python", "-"], ["python", "-c", "x"],
                                               ["python", "/bin/arcsim", "run"])] == [False, False, True, True]


def test_help_and_listings_say_what_the_code_does():
    from arcsim.collectives.limits import DES_EVENTS, STORED_MESSAGES
    from arcsim.topology import GRAMMAR

    listing = " ".join(run_cli("topo", "list", env={"COLUMNS": "100"}).stdout.split())
    assert GRAMMAR.split()[0] in listing  # rich markup once ate "[x<NICs>]"
    assert "[x<NICs>]" in " ".join(run_cli("run", "--help").stdout.split())
    capture = " ".join(run_cli("trace", "capture", "--help").stdout.split())
    assert "Not the precision training ran in (capture: --precision)" in capture and "that is --dtype" in capture
    force = " ".join(run_cli("collective", "--help").stdout.split())
    assert f"{STORED_MESSAGES / 1e6:.0f} M stored messages; DES: {DES_EVENTS / 1e6:.0f} M events" in force


def test_openmp_waits_passively_unless_the_user_chose(monkeypatch):
    from arcsim.processes import wait_passively

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    wait_passively()  # spinning threads cost a cold default run 124 s instead of 1.9 s on busy shared cores
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    wait_passively()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
