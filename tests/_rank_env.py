"""A rank that reports what it runs with (tests/test_ranks.py): ``python _rank_env.py OUT [EXIT [WAIT_FOR]]`` writes
``OUT.<RANK>`` (JSON), then exits with EXIT (``sleep``: sleeps ten minutes), once file WAIT_FOR exists if given."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

PRELOADED = "torch" in sys.modules  # before this script imports it

import torch  # noqa: E402

with open(f"{sys.argv[1]}.{os.environ['RANK']}", "w") as fh:
    json.dump({"name": __name__, "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
               "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "ARCSIM_RANK_TEST")},
               "threads": torch.get_num_threads(), "netns": os.readlink("/proc/self/ns/net"),
               "fifo": os.sched_getscheduler(0) == os.SCHED_FIFO, "pid": os.getpid(), "preloaded": PRELOADED}, fh)
print(f"rank {os.environ['RANK']} wrote its report")
exit_with = sys.argv[2] if len(sys.argv) > 2 else "0"
for _ in range(600):
    if len(sys.argv) < 4 or Path(sys.argv[3]).exists():
        break
    time.sleep(0.1)
if exit_with == "sleep":
    time.sleep(600)
sys.exit(int(exit_with))
