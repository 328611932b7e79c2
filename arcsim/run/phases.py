"""`arcsim run --network-schedule`: the trace's best choices on each phase's network (the measurements are
shared; each phase only prices again)."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console
from rich.table import Table

from arcsim.network_schedule import NetworkSchedule
from arcsim.run.analysis import Analysis
from arcsim.run.decisions import eligible
from arcsim.run.report import short_collective


def per_phase(analysis: Analysis, schedule: NetworkSchedule) -> list[dict[str, Any]]:
    """Per phase: its network, the point chosen on the speed/fidelity front, the fastest candidate at
    --density among those the policy accepts (error within --slack of Top-K's), and the switching policy's
    iteration."""
    phases = []
    for i, phase in enumerate(schedule.phases):
        again = Analysis(dataclasses.replace(analysis.cfg, bandwidth=phase.bandwidth, latency=phase.latency_s),
                         announce=lambda _: None, source=analysis.trace)
        again.share_measurements(analysis)
        result = again.run()
        chosen = result.pareto.chosen
        allowed, _ = eligible(result.candidates, analysis.cfg.slack)  # those the policy would accept
        fastest = min(allowed or result.candidates, key=lambda c: c.iteration_s)
        phases.append({"phase": i + 1, **phase.to_dict(),
                       "chosen": {"compressor": chosen.compressor, "collective": chosen.collective,
                                  "op": next((c.op for c in result.candidates if c.compressor == chosen.compressor),
                                             result.dense.op),
                                  "density": chosen.density, "iteration_s": chosen.iteration_s,
                                  "rel_error": chosen.rel_error, "rule": result.pareto.rule},
                       "fastest": {"compressor": fastest.compressor, "collective": fastest.collective,
                                   "op": fastest.op, "density": fastest.density, "iteration_s": fastest.iteration_s,
                                   "rel_error": fastest.rel_error},
                       "dense_iteration_s": result.dense.iteration_s,
                       "policy_iteration_s": result.policy.iteration_s if result.policy else None})
    return phases


def render_phases(phases: list[dict[str, Any]], schedule: NetworkSchedule, console: Console) -> None:
    table = Table(title=f"Per phase of {schedule.name}: the best choice on each network",
                  caption="chosen: the speed/fidelity front's pick over the ratio grid; fastest accepted: the quickest "
                          "candidate at --density whose error is within --slack of Top-K's; ms per iteration")
    for col in ("phase", "from step", "network", "chosen (front)", "ms", "error", "fastest accepted", "ms ",
                "dense ms"):
        table.add_column(col, justify="left" if col in ("network", "chosen (front)", "fastest accepted")
                         else "right", no_wrap=col == "network")
    for p in phases:
        ch, fa = p["chosen"], p["fastest"]
        density = f"@{ch['density']:g}" if ch["density"] is not None else ""
        table.add_row(str(p["phase"]), str(p["start_step"]), p["network"],
                      f"{ch['compressor']}{density} {short_collective(ch['op'], ch['collective'])}",
                      f"{ch['iteration_s'] * 1e3:.1f}", f"{ch['rel_error']:.3f}",
                      f"{fa['compressor']} {short_collective(fa['op'], fa['collective'])}",
                      f"{fa['iteration_s'] * 1e3:.1f}", f"{p['dense_iteration_s'] * 1e3:.1f}")
    console.print(table)
