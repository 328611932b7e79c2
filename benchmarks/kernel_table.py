"""Turn measured compressor kernel times (gpu_measure.py --parts compress → compress_times.json) into the
device table arcsim prices GPU compression with (devices/kernels/<device>.json), and say how well the
counts fit, and how well the anchor's counts predict another GPU's measurements.

A table measured at densities up to 0.5 fits each compressor's passes per selected element and, with
``--work`` (gpu_session.py's work_times.json), the passes per gathered element of decompression; a table measured
at low densities only holds both at another table's values (``--selected-from``, stated in the table).
Rand-K above ρ 0.1 is left out (arcsim.devices.kernels.fitted_rows says why).

Usage: python benchmarks/kernel_table.py benchmarks/results/h200/compress_times.json \
           benchmarks/results/h200/2026-11-27/compress_times_dense.json --device h200 \
           --work benchmarks/results/h200/2026-11-27/work_times.json
       python benchmarks/kernel_table.py benchmarks/results/h100/compress_times.json --device h100 \
           --selected-from h200
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from arcsim.devices.catalog import device
from arcsim.devices.kernels import (
    ANCHOR,
    WORK_STEPS,
    fit_counts,
    fit_gathered,
    fitted_rows,
    load_counts,
    relative_errors,
    table_path,
    work_counts,
)
from arcsim.files import write_atomic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("measured", type=Path, nargs="+")
    ap.add_argument("--device", required=True, help="catalogue name of the GPU it was measured on")
    ap.add_argument("--work", type=Path, help="gpu_session.py's work_times.json: decompression's gathered passes")
    ap.add_argument("--selected-from", help="hold passes per selected and gathered element at this table's")
    args = ap.parse_args()
    files = [json.loads(p.read_text()) for p in args.measured]
    data = files[0]
    dev = device(args.device)
    rows = fitted_rows([r for f in files for r in f["compressors"]])
    held: dict = {}
    if args.selected_from:
        source, held = load_counts(args.selected_from)
        per_selected = {k: c.per_selected for k, c in source.items()}
        work = {k: source[k] for k in WORK_STEPS}
        gathered, gathered_from = held["gathered_passes"], f"held at {args.selected_from}'s ({held['gathered_from']})"
    else:
        per_selected = None
        if not args.work:
            ap.error("give --work (decompression's measured gathered passes) or --selected-from")
        work_rows = json.loads(args.work.read_text())["rows"]
        gathered, gathered_from = fit_gathered(work_rows, dev), str(args.work)
        work = work_counts(work_rows, dev)
    counts = fit_counts(rows, dev, per_selected)
    fit_err = relative_errors(rows, counts, dev)
    densities = sorted({r["density"] for r in rows if r.get("density") is not None})
    table = {"device": dev.name, "device_name": data["environment"]["device"], "torch": data["environment"]["torch"],
             "date": data["environment"].get("date"), "from": [str(p) for p in args.measured],
             "method": data["method"], "densities": densities,
             "per_selected_from": f"held at {args.selected_from}'s" if args.selected_from else "fitted here",
             "gathered_passes": gathered, "gathered_from": gathered_from,
             "fit_mean_abs_error": statistics.fmean(abs(e) for e in fit_err),
             "counts": {k: vars(v) for k, v in counts.items()},
             "work_counts_from": gathered_from, "work_counts": {k: vars(v) for k, v in work.items()}}
    if dev.name != ANCHOR and table_path(ANCHOR).exists():
        anchor, _ = load_counts(ANCHOR)
        transfer = relative_errors(rows, anchor, dev)
        table["anchor_transfer_mean_abs_error"] = statistics.fmean(abs(e) for e in transfer)
        print(f"{ANCHOR}'s counts priced by {dev.name}'s datasheet: mean |error| "
              f"{table['anchor_transfer_mean_abs_error']:.1%} over {len(transfer)} measured calls")
    for key, c in counts.items():
        print(f"{key:18s} passes {c.passes:8.2f}  per selected {c.per_selected:6.2f}  launches/layer "
              f"{c.per_layer:6.2f}  launches/call {c.fixed:7.1f}")
    for key, c in work.items():
        print(f"{key:18s} passes {c.passes:8.2f}  per element per peer {c.per_peer:5.2f}  launches/call {c.fixed:7.1f}")
    print(f"decompression: {gathered:.1f} passes per gathered element ({gathered_from})")
    print(f"fit: mean |error| {table['fit_mean_abs_error']:.1%} over {len(fit_err)} measured calls")
    write_atomic(table_path(dev.name), json.dumps(table, indent=1) + "\n")
    print(f"wrote {table_path(dev.name)}")


if __name__ == "__main__":
    main()
