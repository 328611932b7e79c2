"""The small-message band (issue 30): gloo's collectives from 1 KiB to 4 MiB, measured and predicted.

For each setting (loopback, or an emulated cluster's ranks, rate and one-way delay) it measures all_reduce,
all_gather and broadcast at 13 sizes (1 KiB … 4 MiB per rank, ×2), REPEATS times each after two warm-ups,
with GAP seconds of idle network before each collective (training's spacing; 0: back to back). Then it
fits calibration the way `arcsim calibrate` does on every other size (1 KiB, 4 KiB, … 4 MiB: its default
grid) and prices all 13 with (a) the two-band α–β lines alone (the model before issue 30) and (b) the
model calibrate now writes (the shape that prices held-out sizes best, two bands or a line with a burst,
through the measured points), so the odd sizes (2 KiB, 8 KiB, … 2 MiB) are held out. --reuse prices the
saved samples again without measuring. Writes every
sample to benchmarks/results/small_band/<setting>.json and one row per (setting, op, size) to
benchmarks/results/small_band/summary.csv; prints the share within 10 % per model, fitted and held out.

    sudo .venv/bin/python benchmarks/small_band.py                  # the four settings below, 20 ms gaps
    sudo .venv/bin/python benchmarks/small_band.py --settings 2:1Gbit:0s --gap 0
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

import numpy as np

from arcsim.testbed.calibrate import SIZE_FACTOR, fit_bands, fits_from, run_microbench

SIZES = tuple(1024 * 2**i for i in range(13))  # 1 KiB … 4 MiB per rank
SETTINGS = ("2:loopback:0s", "2:1Gbit:0s", "2:100Mbit:0s", "2:100Mbit:1ms")
OUT = Path("benchmarks/results/small_band")


def measure(setting: str, repeats: int, gap: float) -> dict:
    ranks, rate, delay = setting.split(":")
    where = "loopback" if rate == "loopback" else "emulated"
    return run_microbench(int(ranks), where, None if where == "loopback" else rate, SIZES, repeats, delay=delay,
                          gap_s=gap, announce=lambda line: print(f"  {line}"))


def rows_for(setting: str, gap: float, measured: dict) -> list[dict]:
    """Per (op, size): the samples' median and spread, and each model's prediction fitted on the even sizes."""
    world = measured["world"]
    even = {op: {size: t for size, t in by.items() if int(size) in SIZES[::2]}
            for op, by in measured["median_s"].items()}
    fits = fits_from({"median_s": even}, world)
    rows = []
    for op, fit in fits.items():
        before = fit_bands([(n, t) for n, t in fit.points], op)  # issue 30's starting point: two α–β bands
        lines, points = before.calibrated(world, []), fit.calibrated(world)
        for size in SIZES:
            samples = measured["samples_s"][op][str(size)]
            nbytes = size * SIZE_FACTOR[op](world)
            median = statistics.median(samples)
            rows.append({"setting": setting, "gap_s": gap, "op": op, "bytes_per_rank": size, "bytes": nbytes,
                         "held_out": size not in SIZES[::2], "median_s": median, "min_s": min(samples),
                         "max_s": max(samples), "p10_s": float(np.percentile(samples, 10)),
                         "p90_s": float(np.percentile(samples, 90)), "repeats": len(samples),
                         "lines_s": lines.time(nbytes), "points_s": points.time(nbytes),
                         "lines_error": lines.time(nbytes) / median - 1,
                         "points_error": points.time(nbytes) / median - 1})
    return rows


def report(rows: list[dict]) -> None:
    for model in ("lines", "points"):
        for held in (False, True):
            part = [r for r in rows if r["held_out"] == held]
            within = sum(abs(r[f"{model}_error"]) <= 0.10 for r in part)
            mape = 100 * statistics.mean(abs(r[f"{model}_error"]) for r in part)
            where = "held out" if held else "fitted  "
            print(f"  {model:6} {where}: {within}/{len(part)} within 10 %, MAPE {mape:.1f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--settings", default=",".join(SETTINGS), help="ranks:rate|loopback:delay, comma-separated")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--gap", type=float, default=0.02, help="idle seconds before each collective")
    parser.add_argument("--reuse", action="store_true", help="price the samples saved by an earlier run again")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    every = []
    for setting in args.settings.split(","):
        print(f"{setting} (gap {args.gap * 1e3:g} ms) …")
        path = OUT / (setting.replace(":", "-") + f"-gap{args.gap * 1e3:g}ms.json")
        if args.reuse:
            measured = json.loads(path.read_text())
        else:
            measured = measure(setting, args.repeats, args.gap)
            path.write_text(json.dumps({"setting": setting, "gap_s": args.gap, **measured}))
        rows = rows_for(setting, args.gap, measured)
        report(rows)
        every += rows
    print("all settings:")
    report(every)
    summary = OUT / "summary.csv"
    old = list(csv.DictReader(summary.open())) if summary.exists() else []
    new = {(r["setting"], float(r["gap_s"])) for r in every}
    keep = [r for r in old if (r["setting"], float(r["gap_s"])) not in new]  # earlier settings stay
    with summary.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(every[0]))
        writer.writeheader()
        writer.writerows(keep + every)


if __name__ == "__main__":
    main()
