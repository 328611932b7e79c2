"""Turn measured compressor kernel times (gpu_measure.py --parts compress → compress_times.json) into the
device table arcsim prices GPU compression with (devices/kernels/<device>.json), and say how well the
counts fit, and how well the anchor's counts predict another GPU's measurements.

Usage: python benchmarks/kernel_table.py benchmarks/results/h100/compress_times.json --device h100
       python benchmarks/kernel_table.py benchmarks/results/h200/compress_times.json --device h200
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from arcsim.devices.catalog import device
from arcsim.devices.kernels import ANCHOR, SCOPE_FREE, KernelCounts, fit_counts, load_counts, table_path
from arcsim.files import write_atomic


def errors(rows: list[dict], counts: dict[str, KernelCounts], dev) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for r in rows:
        if "other" in (r.get("variant") or ""):
            continue
        scope = None if r["compressor"] in SCOPE_FREE else r["scope"] or "bucket"
        key = r["compressor"] if scope is None else f"{r['compressor']}/{scope}"
        out.append(counts[key].seconds(r["numel"], r["layers"], dev) / (r["ms"] * 1e-3) - 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("measured", type=Path)
    ap.add_argument("--device", required=True, help="catalogue name of the GPU it was measured on")
    args = ap.parse_args()
    data = json.loads(args.measured.read_text())
    dev = device(args.device)
    rows = data["compressors"]
    counts = fit_counts(rows, dev)
    fit_err = errors(rows, counts, dev)
    table = {"device": dev.name, "device_name": data["environment"]["device"], "torch": data["environment"]["torch"],
             "date": data["environment"].get("date"), "from": str(args.measured), "method": data["method"],
             "fit_mean_abs_error": statistics.fmean(abs(e) for e in fit_err),
             "counts": {k: vars(v) for k, v in counts.items()}}
    if dev.name != ANCHOR and table_path(ANCHOR).exists():
        anchor, _ = load_counts(ANCHOR)
        transfer = errors(rows, anchor, dev)
        table["anchor_transfer_mean_abs_error"] = statistics.fmean(abs(e) for e in transfer)
        print(f"{ANCHOR}'s counts priced by {dev.name}'s datasheet: mean |error| "
              f"{table['anchor_transfer_mean_abs_error']:.1%} over {len(transfer)} measured calls")
    for key, c in counts.items():
        print(f"{key:18s} passes {c.passes:8.2f}  launches/layer {c.per_layer:6.2f}  launches/call {c.fixed:7.1f}")
    print(f"fit: mean |error| {table['fit_mean_abs_error']:.1%} over {len(fit_err)} measured calls")
    write_atomic(table_path(dev.name), json.dumps(table, indent=1) + "\n")
    print(f"wrote {table_path(dev.name)}")


if __name__ == "__main__":
    main()
