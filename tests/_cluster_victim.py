"""Builds an emulated cluster (argv: prefix [delay]), starts a process in a rank, says 'up', then waits to be
interrupted or killed."""

from __future__ import annotations

import subprocess
import sys
import time

from arcsim.testbed.cluster import EmulatedCluster

with EmulatedCluster(2, "100Mbit", sys.argv[2] if len(sys.argv) > 2 else "0s", prefix=sys.argv[1]) as c:
    subprocess.Popen(c.command(1, ["sleep", "300"]))
    print("up", flush=True)
    time.sleep(300)
