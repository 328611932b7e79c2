"""Sampled against exact measurement (docs/run.md, "Sampled measurements"): run `arcsim run` cold twice on one
trace and topology, with --exact and without, each in a cache directory of its own, and print per compressor
(at --density) the exact error, the sampled error ± its interval, whether either lies inside the other's
interval, the two recommendations, and each run's wall and CPU seconds.

    python benchmarks/sampling_check.py --trace /tmp/l60/llama_60m.npz -t 4x8-eth25-a100
    python benchmarks/sampling_check.py                       # the shipped default example
    ARCSIM_SAMPLE_ELEMENTS=1e5 python benchmarks/sampling_check.py   # force sampling on the small example
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def run(args: list[str], exact: bool, work: Path) -> tuple[dict[str, Any], str, float, float]:
    """One cold `arcsim run`: its JSON, its first output lines, wall and CPU seconds (the child's user+sys)."""
    out = work / ("exact.json" if exact else "sampled.json")
    env = {**os.environ, "ARCSIM_CACHE_DIR": str(work / ("cache-exact" if exact else "cache-sampled")),
           "COLUMNS": "400"}
    cmd = [sys.executable, "-m", "arcsim", "run", *args, "--json", str(out), *(["--exact"] if exact else [])]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    head = "\n".join(line for line in proc.stdout.splitlines()[:6])
    return json.loads(out.read_text()), head, wall, cpu


def errors(result: dict[str, Any]) -> dict[tuple[str, str, Any], dict[str, Any]]:
    """Per (compressor, hierarchy, density): a candidate's error and interval (equal over its collectives)."""
    out = {}
    for c in result["candidates"]:
        out.setdefault((c["compressor"], c.get("hierarchy", "flat"), c["density"]), c)
    return out


def recommended(head: str) -> str:
    """The "Recommended: …" sentence of a run's first lines (joined where the terminal wrapped it)."""
    lines = head.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("Recommended")), None)
    if at is None:
        return head
    return lines[at].strip()


def measurements(cache: Path) -> dict[tuple[str, float, int, str], Any]:
    """Every measurement kept in a run's cache, by (compressor, density, steps, hierarchy)."""
    import gzip

    from arcsim.comm.log import CommRecord
    from arcsim.run.measurement import Measurement

    known = {f.name for f in dataclasses.fields(Measurement)}
    out = {}
    for path in sorted((cache / "arcsim-results").glob("*.json.gz")):
        entry = json.loads(gzip.decompress(path.read_bytes()))
        raw = entry.get("value") if isinstance(entry, dict) else None
        if not isinstance(raw, dict) or "err2" not in raw:
            continue
        raw["records"] = [[[CommRecord(**r) for r in recs] for recs in step] for step in raw["records"]]
        m = Measurement(**{k: v for k, v in raw.items() if k in known})  # (an older run's cache: its fields)
        out[m.compressor, m.density, len(m.err2), m.hierarchy] = m
    return out


def inside(x: float, ci: list[float] | None) -> bool:
    return ci is not None and ci[0] - 1e-12 <= x <= ci[1] + 1e-12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=None)
    parser.add_argument("-t", "--topology", default=None)
    parser.add_argument("--work", default=None, help="directory for the two caches and JSONs (default: a temp one)")
    parser.add_argument("--reuse", action="store_true", help="compare the runs already in --work (not run again)")
    ns, extra = parser.parse_known_args()
    args = [*(["--trace", ns.trace] if ns.trace else []), *(["-t", ns.topology] if ns.topology else []), *extra]
    work = Path(ns.work or tempfile.mkdtemp(prefix="sampling-check-"))
    work.mkdir(parents=True, exist_ok=True)
    if ns.reuse:
        saved = json.loads((work / "runs.json").read_text()) if (work / "runs.json").is_file() else \
            {n: ["", float("nan"), float("nan")] for n in ("exact", "sampled")}  # times not kept
        exact, sampled = (json.loads((work / f"{n}.json").read_text()) for n in ("exact", "sampled"))
        exact_head, exact_wall, exact_cpu = saved["exact"]
        sampled_head, sampled_wall, sampled_cpu = saved["sampled"]
    else:
        exact, exact_head, exact_wall, exact_cpu = run(args, True, work)
        sampled, sampled_head, sampled_wall, sampled_cpu = run(args, False, work)
        (work / "runs.json").write_text(json.dumps({"exact": [exact_head, exact_wall, exact_cpu],
                                                    "sampled": [sampled_head, sampled_wall, sampled_cpu]}))
    ex, sa = errors(exact), errors(sampled)
    print(f"arcsim run {' '.join(args) or '(the default example)'}")
    print(f"{'compressor':<22} {'density':>8} {'exact':>18} {'sampled':>18}  inside?")
    fails = 0
    for key, e in ex.items():
        s = sa.get(key)
        if s is None:
            continue
        ok = inside(s["rel_error"], e["rel_error_ci"]) or inside(e["rel_error"], s["rel_error_ci"]) \
            or s["rel_error"] == e["rel_error"]
        fails += not ok

        def fmt(c: dict[str, Any]) -> str:
            ci = c["rel_error_ci"]
            return f"{c['rel_error']:.4f}" + ("" if ci is None else f"±{(ci[1] - ci[0]) / 2:.4f}")

        name = key[0] + ("" if key[1] == "flat" else f" ({key[1]})")
        density = "-" if key[2] is None else f"{key[2]:g}"
        print(f"{name:<22} {density:>8} {fmt(e):>18} {fmt(s):>18}  {'yes' if ok else 'NO'}")
    ex_m, sa_m = measurements(work / "cache-exact"), measurements(work / "cache-sampled")
    grid = [k for k in ex_m if k in sa_m and k[2] < max(k2[2] for k2 in ex_m)]
    if grid:
        print(f"\nthe ratio grid (measured on {grid[0][2]} step(s); sampled: ± over the bucket sample only)")
        print(f"{'compressor':<22} {'density':>8} {'exact':>18} {'sampled':>18}  inside?")
    for key in sorted(grid):
        e, s = ex_m[key], sa_m[key]
        ei, si = e.rel_error_interval(), s.rel_error_interval()
        ok = inside(s.rel_error(), list(ei) if ei else None) or inside(e.rel_error(), list(si) if si else None) \
            or s.rel_error() == e.rel_error()
        fails += not ok
        width = "" if si is None else f"±{(si[1] - si[0]) / 2:.4f}"
        print(f"{key[0]:<22} {key[1]:>8g} {e.rel_error():>18.4f} {f'{s.rel_error():.4f}{width}':>18}  "
              f"{'yes' if ok else 'NO'}")
    pairs = [(ex_m[k], sa_m[k]) for k in ex_m if k in sa_m]
    moved = [abs(s.rel_error() - e.rel_error()) for e, s in pairs]
    sizes = [s.bytes_per_rank() / e.bytes_per_rank() for e, s in pairs if e.bytes_per_rank() > 0]
    if moved:
        print(f"\nevery measurement ({len(pairs)}): |sampled − exact error| median {statistics.median(moved):.4f}, "
              f"largest {max(moved):.4f}; bytes per rank sampled / exact {min(sizes):.3f}–{max(sizes):.3f} "
              f"(median {statistics.median(sizes):.4f}); {fails} outside both intervals")
    sampling = [a for a in sampled["assumptions"] if a.startswith("SAMPLED")]
    print(f"\nsampling: {sampling[0] if sampling else 'none (below the threshold: every bucket measured)'}")
    def answer(r: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(r[f] for f in ("compressor", "collective", "op", "hierarchy", "density"))

    same = answer(exact["recommendation"]) == answer(sampled["recommendation"])
    for name, result, head in (("exact", exact, exact_head), ("sampled", sampled, sampled_head)):
        r = result["recommendation"]
        print(f"{name + ':':<9}{' '.join(str(x) for x in answer(r))}: {r['iteration_s'] * 1e3:.2f} ms, "
              f"error {r['rel_error']:.4f}" + (f"\n         {recommended(head)}" if head else ""))
    print(f"recommendation {'the same' if same else 'DIFFERS'}")
    print(f"\ncold run, wall / CPU s: exact {exact_wall:.1f} / {exact_cpu:.1f}, "
          f"sampled {sampled_wall:.1f} / {sampled_cpu:.1f}")
    measuring = {k: r["timings_s"].get("measuring, wall") for k, r in (("exact", exact), ("sampled", sampled))}
    print(f"measuring, wall s: exact {measuring['exact']:.1f}, sampled {measuring['sampled']:.1f}")
    sys.exit(1 if fails or not same else 0)


if __name__ == "__main__":
    main()
