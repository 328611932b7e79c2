"""Fit the device model's efficiencies to the measured H100 profiles and say how well it predicts.

Writes devices/efficiency.json (what `arcsim device predict` and `arcsim run --gpu` use) with:
- the efficiencies fitted on every shipped H100 profile (6 models × 5 batches × fp32/bf16);
- leave-one-out: each profile predicted by a fit on the other 59;
- leave-one-model-out: each model predicted by a fit that never saw it (the honest error for a new model);
- transfer: the H200 profiles (measured, never fitted) predicted from the H100 fit and the H200's datasheet
  and measured launch cost.
Errors are relative errors of forward + backward time; ``phases`` keeps each profile's forward and backward
error apart (printed too). The shipped profiles were timed with a CUDA event per parameter: that hook's host
cost (``hook``) is measured from the profiles' own per-parameter timelines (compute.profiler_hook), not fitted,
so the fit cannot move it into autograd's own cost per operation (``autograd``); a prediction prices DDP's hook
(compute.DDP_HOOK) instead.

Usage: python benchmarks/device_fit.py [--no-loo]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from arcsim.devices.catalog import device
from arcsim.devices.compute import DDP_HOOK, FIT_FILE, fit, measured_profiles, phase_seconds, step_error
from arcsim.files import write_atomic

FIT_DEVICE = "h100"
REAL_MODELS = ("resnet18", "resnet50", "vit_b_16", "gpt2_small")  # cnn and mlp_wide are toys, host-bound


def summary(errors: dict[str, float]) -> dict[str, float]:
    values = [abs(e) for e in errors.values()]
    real = [abs(e) for k, e in errors.items() if k.split("-")[0] in REAL_MODELS]
    return {"mean_abs": statistics.fmean(values), "max_abs": max(values),
            "mean_abs_real_models": statistics.fmean(real) if real else float("nan"),
            "within_15pct": sum(v <= 0.15 for v in values) / len(values)}


def key(m) -> str:  # type: ignore[no-untyped-def]
    return f"{m.model}-b{m.batch}-{m.precision}"


def phase_errors(m, dev, eff) -> dict[str, float]:  # type: ignore[no-untyped-def]
    w = m.workload()
    return {phase: phase_seconds(w, phase, dev, m.precision, eff, m.instrumented) / measured - 1
            for phase, measured in (("forward", m.forward_s), ("backward", m.backward_s))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-loo", action="store_true", help="skip the leave-one-out refits (minutes)")
    args = ap.parse_args()
    dev = device(FIT_DEVICE)
    cases = measured_profiles(FIT_DEVICE)
    started = time.perf_counter()
    eff = fit(cases, dev)
    print(f"fit on {len(cases)} {FIT_DEVICE} profiles in {time.perf_counter() - started:.1f} s: {eff}", flush=True)
    out: dict = {"device": FIT_DEVICE, "efficiency": eff.to_dict(),
                 "fitted_on": [str(m.path.name) for m in cases],
                 "ddp_hook_launches": DDP_HOOK,
                 "in_sample": {key(m): step_error(m, dev, eff) for m in cases},
                 "phases": {"h100": {key(m): phase_errors(m, dev, eff) for m in cases}}}
    if not args.no_loo:
        loo = {}
        for i, m in enumerate(cases):
            rest = cases[:i] + cases[i + 1:]
            loo[key(m)] = step_error(m, dev, fit(rest, dev, start=eff))
            print(f"leave-one-out {key(m):24s} {loo[key(m)]:+.1%}", flush=True)
        out["leave_one_out"] = loo
        by_model = {}
        for model in sorted({m.model for m in cases}):
            held = [m for m in cases if m.model == model]
            trained = fit([m for m in cases if m.model != model], dev, start=eff)
            for m in held:
                by_model[key(m)] = step_error(m, dev, trained)
            print(f"leave-one-model-out {model:10s} mean |error| "
                  f"{statistics.fmean(abs(by_model[key(m)]) for m in held):.1%}", flush=True)
        out["leave_one_model_out"] = by_model
    transfer = {}
    for other in ("h200",):
        target = device(other)
        transfer[other] = {key(m): step_error(m, target, eff) for m in measured_profiles(other)}
        out["phases"][other] = {key(m): phase_errors(m, target, eff) for m in measured_profiles(other)}
    for where, errors in out["phases"].items():
        for k, e in errors.items():
            print(f"{where} {k:24s} forward {e['forward']:+7.1%} backward {e['backward']:+7.1%}")
        print(f"{where} mean |error| forward {statistics.fmean(abs(e['forward']) for e in errors.values()):.1%} "
              f"backward {statistics.fmean(abs(e['backward']) for e in errors.values()):.1%}")
    out["transfer"] = transfer
    out["summary"] = {name: summary(errors) for name, errors in
                      [("in_sample", out["in_sample"]), ("leave_one_out", out.get("leave_one_out", {})),
                       ("leave_one_model_out", out.get("leave_one_model_out", {})),
                       *((f"transfer_{k}", v) for k, v in transfer.items())] if errors}
    for name, s in out["summary"].items():
        print(f"{name:22s} mean |error| {s['mean_abs']:.1%} (real models {s['mean_abs_real_models']:.1%}), "
              f"max {s['max_abs']:.1%}, within 15 %: {s['within_15pct']:.0%}")
    write_atomic(FIT_FILE, json.dumps(out, indent=1) + "\n")
    print(f"wrote {FIT_FILE}")


if __name__ == "__main__":
    main()
