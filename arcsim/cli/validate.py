"""`arcsim validate`: arcsim's predictions against measured DDP runs on the emulated cluster."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from arcsim.catalog import COMPRESSORS
from arcsim.cli.cluster import prefix_option
from arcsim.cli.common import (
    DENSITY,
    Count,
    ListOf,
    SizeGrid,
    console,
    given_options,
    json_option,
    note,
    tables_wanted,
    write_json,
)
from arcsim.cli.paths import InputPath, OutputPath
from arcsim.errors import ArcsimError
from arcsim.files import write_atomic
from arcsim.testbed import VALIDATE_WORKER
from arcsim.units import parse_rate


def _list(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


VALIDATE_WRITES = ("validation.csv", "validation.png", "validation/*")  # what --out holds after a run


@click.command("validate")
@click.option("--ranks", "rank_list", default="2,4", show_default=True, type=ListOf(Count(minimum=2), unique=True),
              help="Rank counts, comma-separated (2 or more: a collective needs peers).")
@click.option("--bandwidth", default="1Gbit,100Mbit", show_default=True, help="Link rates, comma-separated.")
@click.option("--delay", default="0s", show_default=True, help="One-way delay added to every link, e.g. 0.5ms.")
@click.option("--ranks-per-node", default="1", show_default=True, type=Count(),
              help="Ranks per emulated node (they share its namespace and link; loopback between them).")
@click.option("--hierarchy", default="flat", show_default=True,
              help="flat, node (node-aware hooks: dense inside a node, compressed between nodes) or both; node "
                   "needs --ranks-per-node 2 or more.")
@click.option("--compressors", "-c", default="dense,topk,arctopk,star,powersgd", show_default=True)
@click.option("--model", default="mlp_wide", show_default=True)
@click.option("--dataset", default="digits", show_default=True)
@click.option("--density", default=0.01, show_default=True, type=DENSITY)
@click.option("--steps", default="30", show_default=True, type=Count(), help="Timed DDP steps per compressor.")
@click.option("--batch", default="32", show_default=True, type=Count(), help="Batch per rank.")
@click.option("--repeats", default="3", show_default=True, type=Count(),
              help="DDP trainings per case, each in fresh processes: the median and min–max of their medians.")
@click.option("--calibration-sizes", type=SizeGrid(), default=None,
              help="Per-rank sizes of the calibration before the trainings (default 256 B … 4 MiB, ×4; fewer or "
                   "smaller sizes calibrate sooner, as arcsim calibrate --sizes).")
@click.option("--calibration-repeats", default="9", show_default=True, type=Count(),
              help="Timed repeats per calibration size (median).")
@prefix_option
@click.option("--out", default=None, type=OutputPath(directory=True, writes=VALIDATE_WRITES),
              help="Where the measured cases go (default: reports; --report writes nothing there).")
@click.option("--write-config", type=OutputPath(directory=True, writes=("config.json",)), default=None,
              help="Real cluster: write DIR/config.json for the torchrun worker and print the commands.")
@click.option("--measured", type=InputPath(directory=True, file=False), default=None,
              help="Real cluster: compare the worker's results in DIR (with --topology) instead of emulating.")
@click.option("--topology", "-t", type=InputPath(), default=None,
              help="With --measured: the topology calibrated on that cluster (arcsim calibrate under torchrun).")
@click.option("--report", type=InputPath(), default=None,
              help="Print a validation CSV written before (its table, summary and the term furthest off in each "
                   "case outside the spread) without measuring anything.")
@json_option
def validate(rank_list: tuple[int, ...], bandwidth: str, delay: str, ranks_per_node: int, hierarchy: str,
             compressors: str, model: str, dataset: str, density: float, steps: int, batch: int, repeats: int,
             calibration_sizes: tuple[int, ...] | None, calibration_repeats: int, prefix: str, out: str | None,
             write_config: str | None, measured: str | None, topology: str | None, report: str | None,
             json_out: str | None) -> None:
    """Measure DDP iterations on the emulated cluster (or a real one) and compare with arcsim run's predictions."""
    calibrating = given_options("calibration_sizes", "calibration_repeats")
    elsewhere = next((f for f, v in (("--report", report), ("--measured", measured), ("--write-config", write_config))
                      if v), None)
    if calibrating and elsewhere:
        raise ArcsimError(f"{' and '.join(calibrating)} shape{'s' if len(calibrating) == 1 else ''} the calibration "
                          f"before the emulated cluster's trainings; {elsewhere} runs none (on a real cluster, "
                          "arcsim calibrate --sizes does): drop it")
    if elsewhere and given_options("prefix"):
        raise ArcsimError(f"--prefix names the emulated cluster's namespaces; {elsewhere} builds none: drop it")
    import json

    from arcsim.catalog import MODELS
    from arcsim.testbed.validate import (
        ValidateConfig,
        read_report,
        run_validation,
        summary,
        validate_measured,
        worker_config,
        write_outputs,
    )

    if report:
        if measured or write_config:
            raise ArcsimError("--report prints a validation CSV written before; it takes neither --measured nor "
                              "--write-config")
        rows = read_report(Path(report))
        s = summary(rows)
        write_json({"rows": rows, "summary": s, "csv": report}, json_out)
        if tables_wanted(json_out):
            _render(rows, s)
        return
    for rate in _list(bandwidth):
        if not parse_rate(rate) > 0:
            raise ArcsimError(f"--bandwidth {rate} carries nothing; give link rates above 0, e.g. 1Gbit,100Mbit")
    comps = _list(compressors)
    unknown = [c for c in comps if c not in COMPRESSORS]
    if unknown:
        raise ArcsimError(f"unknown compressor {', '.join(unknown)}; choose from {', '.join(COMPRESSORS)}")
    if model not in MODELS:
        raise ArcsimError(f"unknown model {model!r}; choose one of: {', '.join(MODELS)}")
    if not 0 < density <= 1:
        raise ArcsimError(f"--density must lie in (0, 1], got {density}")
    if repeats < 1:
        raise ArcsimError(f"--repeats must be at least 1 (3 or more to see the noise), got {repeats}")
    hierarchies = _hierarchies(hierarchy, ranks_per_node, rank_list)
    if measured and hierarchies != ("flat",):
        raise ArcsimError("--measured compares flat runs only; drop --hierarchy (node-aware runs on a real cluster "
                          "are not written yet)")
    cfg = ValidateConfig(ranks=rank_list, bandwidths=_list(bandwidth), delay=delay, compressors=comps, model=model,
                         dataset=dataset, density=density, steps=steps, batch=batch, out_dir=Path(out or "reports"),
                         repeats=repeats, ranks_per_node=ranks_per_node, hierarchies=hierarchies, prefix=prefix,
                         calib_repeats=calibration_repeats,
                         calib_sizes=tuple(sorted(calibration_sizes or ValidateConfig.calib_sizes)))
    if write_config:
        directory = Path(write_config)
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(directory / "config.json", json.dumps(worker_config(cfg), indent=1))
        note(f"wrote {directory / 'config.json'}; on the cluster run, with your torchrun rendezvous options:\n"
             f"  torchrun ... -m arcsim calibrate --out {directory}/cluster.yaml\n"
             f"  torchrun ... -m {VALIDATE_WORKER} {directory}/config.json {directory}/real-\n"
             f"then here: arcsim validate --measured {directory} --topology {directory}/cluster.yaml")
        return
    if measured:
        if not topology:
            raise ArcsimError("--measured needs --topology (the file arcsim calibrate wrote on that cluster)")
        rows = validate_measured(cfg, Path(measured), Path(topology), note)
    else:
        from arcsim.processes import refuse_stray_rank

        refuse_stray_rank("arcsim validate")
        rows = run_validation(cfg, note)
    csv, png = write_outputs(rows, cfg.out_dir)
    s = summary(rows)
    write_json({"rows": rows, "summary": s, "csv": str(csv), "chart": str(png)}, json_out)
    note(f"wrote {csv} and {png}")
    if tables_wanted(json_out):
        _render(rows, s)


def _hierarchies(hierarchy: str, ranks_per_node: int, ranks: tuple[int, ...]) -> tuple[str, ...]:
    """The hierarchies asked for, checked against the emulated nodes."""
    from arcsim.catalog import HIERARCHIES, hierarchy_message
    from arcsim.topology import splits_into_nodes

    if hierarchy not in HIERARCHIES:
        raise ArcsimError(hierarchy_message(hierarchy))
    chosen = ("flat", "node") if hierarchy == "both" else (hierarchy,)
    if "node" in chosen and ranks_per_node < 2:
        raise ArcsimError(f"--hierarchy {hierarchy} needs nodes of two or more ranks: add --ranks-per-node 2 "
                          "(e.g. --ranks 4 --ranks-per-node 2)")
    bad = [r for r in ranks if not splits_into_nodes(r, ranks_per_node)]
    if ranks_per_node > 1 and bad:
        raise ArcsimError(f"--ranks-per-node {ranks_per_node} must divide every rank count into two or more nodes; "
                          f"{', '.join(map(str, bad))} does not (e.g. --ranks 4 --ranks-per-node 2)")
    return chosen


def _render(rows: list[dict], s: dict) -> None:
    from arcsim.testbed.validate import setting, setting_label, what_ran

    table = Table(title=f"Validation: {what_ran(rows)} on the emulated cluster (gloo)")
    node_aware = any(setting(r)[2] != "flat" for r in rows)
    columns = ("ranks", "bandwidth", *(("hierarchy",) if node_aware else ()), "compressor",
               "measured ms (runs' min–max)", "predicted ms", "error", "inside")
    for col in columns:
        table.add_column(col, justify="left" if col in ("bandwidth", "hierarchy", "compressor") else "right")
    for r in rows:
        table.add_row(str(r["ranks"]), r["bandwidth"], *((setting(r)[2],) if node_aware else ()), r["compressor"],
                      f"{r['measured']:.2f} ({r['spread_min']:.2f}–{r['spread_max']:.2f})",
                      f"{r['predicted']:.2f}", f"{r['error']:+.1%}", "yes" if r["inside_spread"] else "no")
    console.print(table)
    console.print(f"MAPE {s['mape']:.1%} over {s['cases']} cases' medians (goal ≤ 10%); {s['inside_spread']} of "
                  f"{s['cases']} predictions inside the measured spread (goal ≥ 80%)")
    console.print("  by compressor: " + ", ".join(f"{k} {v:.1%}" for k, v in s["mape_by_compressor"].items()))
    if len(s["mape_by_hierarchy"]) > 1:
        console.print("  by hierarchy: " + ", ".join(f"{k} {v:.1%}" for k, v in s["mape_by_hierarchy"].items()))
    for c in s["ag_ar"]:
        verdict = "agrees" if c["agrees"] else "DISAGREES"
        scope = "" if c["counts"] else " (gap ≤ 10%: not counted)"
        where = setting_label((c["ranks"], c["bandwidth"], c["hierarchy"]))
        console.print(f"  {where}: measured faster {c['measured_faster']} by "
                      f"{c['measured_gap']:.0%}, predicted {c['predicted_faster']}: {verdict}{scope}")
    if s["outside_by_term"]:
        _render_terms(s["outside_by_term"])


def _render_terms(outside: list[dict]) -> None:
    from arcsim.testbed.validate import setting_label

    table = Table(title="Outside the spread: the term furthest off (compute: forward and backward; hook: "
                        "compression and collectives; other: the rest of the iteration)")
    for col in ("case", "term", "measured ms", "predicted ms", "gap ms", "of the iteration", "case error"):
        table.add_column(col, justify="left" if col in ("case", "term") else "right")
    for t in outside:
        case = f"{setting_label((t['ranks'], t['bandwidth'], t['hierarchy']))}, {t['compressor']}"
        table.add_row(case, t["term"], f"{t['measured_s'] * 1e3:.2f}", f"{t['predicted_s'] * 1e3:.2f}",
                      f"{t['gap_s'] * 1e3:+.2f}", f"{t['share']:+.1%}", f"{t['error']:+.1%}")
    console.print(table)
