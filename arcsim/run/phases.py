"""`arcsim run --network-schedule`: the trace's best choices on each phase's network (the measurements are
shared; each phase only prices again)."""

from __future__ import annotations

import dataclasses
from typing import Any

from rich.console import Console
from rich.table import Table

from arcsim.network_schedule import NetworkSchedule
from arcsim.run.analysis import Analysis, RunResult
from arcsim.run.decisions import MIX, usable
from arcsim.run.report import short_collective


def per_phase(analysis: Analysis, schedule: NetworkSchedule) -> list[dict[str, Any]]:
    """Per phase: its network, the recommendation on it (auto's or paper's choice, a per-bucket mix included;
    otherwise the point chosen on the speed/fidelity front), the fastest usable candidate at --density, and the
    switching policy's iteration."""
    phases = []
    for i, phase in enumerate(schedule.phases):
        again = Analysis(dataclasses.replace(analysis.cfg, bandwidth=phase.bandwidth, latency=phase.latency_s),
                         announce=lambda _: None, source=analysis.trace)
        again.share_measurements(analysis)
        result = again.run(lean=True)  # no crossover or tips: a phase's row shows neither
        chosen = result.recommendation
        rule = _rule(result)
        fastest = min([c for c in result.candidates if usable(c)] or result.candidates, key=lambda c: c.iteration_s)
        phases.append({"phase": i + 1, **phase.to_dict(),
                       "chosen": {"compressor": chosen.compressor, "collective": chosen.collective,
                                  "op": chosen.op, "hierarchy": chosen.hierarchy, "density": chosen.density,
                                  "iteration_s": chosen.iteration_s, "rel_error": chosen.rel_error, "rule": rule,
                                  "time_to_target_s": chosen.time_to_target_s},
                       "fastest": {"compressor": fastest.compressor, "collective": fastest.collective,
                                   "op": fastest.op, "hierarchy": fastest.hierarchy, "density": fastest.density,
                                   "iteration_s": fastest.iteration_s, "rel_error": fastest.rel_error},
                       "dense_iteration_s": result.dense.iteration_s,
                       "policy_iteration_s": result.policy.iteration_s if result.policy else None})
    return phases


def _rule(result: RunResult) -> str:
    """What chose the recommendation: auto's time to target, paper's rule, else the front's."""
    pol = result.policy
    if pol is None or pol.name not in ("auto", "paper"):
        return result.pareto.rule
    return "time to target" if pol.name == "auto" else pol.rule


def render_phases(phases: list[dict[str, Any]], schedule: NetworkSchedule, console: Console) -> None:
    table = Table(title=f"Per phase of {schedule.name}: the best choice on each network",
                  caption="chosen: the recommendation on that network (the policy's under auto and paper; else the "
                          "speed/fidelity front's pick); fastest usable: the quickest candidate at --density whose "
                          "error is below 0.95; ', node': node-aware (--hierarchy); ms per iteration")
    for col in ("phase", "from step", "network", "chosen", "ms", "error", "fastest usable", "ms ",
                "dense ms"):
        table.add_column(col, justify="left" if col in ("network", "chosen", "fastest usable")
                         else "right", no_wrap=col == "network")
    for p in phases:
        ch, fa = p["chosen"], p["fastest"]
        density = f"@{ch['density']:g}" if ch["density"] is not None else ""
        table.add_row(str(p["phase"]), str(p["start_step"]), p["network"],
                      "per-bucket mix" if ch["compressor"] == MIX else
                      f"{ch['compressor']}{density} {short_collective(ch['op'], ch['collective'], ch['hierarchy'])}",
                      f"{ch['iteration_s'] * 1e3:.1f}", f"{ch['rel_error']:.3f}",
                      f"{fa['compressor']} {short_collective(fa['op'], fa['collective'], fa['hierarchy'])}",
                      f"{fa['iteration_s'] * 1e3:.1f}", f"{p['dense_iteration_s'] * 1e3:.1f}")
    console.print(table)
