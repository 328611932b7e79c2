"""Rank processes forked from a server that imported torch once (arcsim.testbed.ranks): each runs as ``python script``
or ``python -m module`` would, with its own environment and folder; a failing or late rank is one clear error, and no
rank is left running."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from arcsim.errors import ArcsimError
from arcsim.testbed.ranks import RankLaunch, run_ranks

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "_rank_env.py")


def launch(out: Path, rank: int, *extra: str) -> RankLaunch:
    env = {**os.environ, "RANK": str(rank), "OMP_NUM_THREADS": "1", "ARCSIM_RANK_TEST": f"r{rank}"}
    return RankLaunch(SCRIPT, (str(out), *extra), env, script=True)


def report(out: Path, rank: int) -> dict:
    return json.loads(Path(f"{out}.{rank}").read_text())


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_each_rank_is_a_process_of_its_own_run_as_its_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run_ranks([launch(tmp_path / "out", r) for r in range(2)], 120)
    got = [report(tmp_path / "out", r) for r in range(2)]
    assert [g["env"]["ARCSIM_RANK_TEST"] for g in got] == ["r0", "r1"]  # each its own environment
    for g in got:
        assert g["name"] == "__main__" and g["argv"] == [SCRIPT, str(tmp_path / "out")]
        assert g["cwd"] == str(tmp_path) and g["path0"] == str(HERE)  # as `python script` from this folder
        assert g["threads"] == 1  # OMP_NUM_THREADS as the rank's environment says, not as the server's did
        assert g["netns"] == os.readlink("/proc/self/ns/net") and not g["fifo"]
        assert g["preloaded"]  # forked from a server that imported torch (whichever caller started it: each asks)
    assert len({os.getpid(), got[0]["pid"], got[1]["pid"]}) == 3


def test_a_module_runs_as_python_dash_m_from_the_working_folder(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_rank.py").write_text("import sys\nopen(sys.argv[1], 'w').write(__name__ + ' ' + sys.argv[0])\n")
    monkeypatch.chdir(tmp_path)
    run_ranks([RankLaunch("my_rank", (str(tmp_path / "said"),), dict(os.environ))], 120)
    assert (tmp_path / "said").read_text() == f"__main__ {tmp_path / 'my_rank.py'}"


def test_a_failing_rank_is_one_error_with_its_output_and_the_others_are_killed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(ArcsimError, match=r"rank 1 failed \(exit code 3\): rank 1 wrote its report"):
        run_ranks([launch(out, 0, "sleep"), launch(out, 1, "3", f"{out}.0")], 120)  # rank 1 fails once 0 sleeps
    assert gone(report(out, 0)["pid"])


def test_a_rank_past_the_timeout_is_an_error_and_killed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(ArcsimError, match="did not finish within 5 s"):
        run_ranks([launch(out, 0, "sleep")], 5)
    assert gone(report(out, 0)["pid"])
