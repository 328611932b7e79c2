"""What every rank of a worker script (tests/_*_check.py, _*_ddp.py) does last: write its report as
``rank<r>.json`` in the folder the test reads, and leave the process group."""

from __future__ import annotations

import json
import os

from arcsim.testbed.ddp_train import leave_process_group


def report_and_leave(out_dir: str, rank: int, report: object) -> None:
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(report, fh)
    leave_process_group()
