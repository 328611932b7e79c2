"""One lent GPU's session, in one call: what no CPU gives, as small JSON files under --out.

Parts (``--parts``, comma-separated; each stops starting new work once its share of ``--budget-s`` is spent):
- ``work``: the compression work frameworks pay around the collectives, on one flat fp32 vector of ResNet-50's
  size (25.6 M) and of 1 M: selection (torch.topk, a full sort, DGC's sampled threshold) at densities up to 0.5;
  decompression of p peers' sparse values (one index_add over p·k, p per-peer index_adds, and GRACE's dense
  scatter per peer then sum); the quantisers' and sign methods' passes (QSGD, TernGrad, natural, packed signs,
  majority vote) → work_times.json.
- ``dense``: benchmarks/gpu_measure.py's compression timings of the sparsifiers at densities 0.25 and 0.5 (flat
  vectors and ResNet-50's DDP buckets, both scopes) → compress_times_dense.json.
- ``compute``: measured forward/backward (``arcsim trace profile --device cuda``) beside the device model's
  (``arcsim device predict --modelled``) for LLaMA-60M, GPT-2 small and ResNet-50, fp32 and bf16, two batches;
  and ``arcsim run --live --device cuda`` end to end on LLaMA-60M and ResNet-50 → compute.json.
- ``hook``: a user's torchrun job recording with arcsim's hook under NCCL, merged and priced → hook.json.
- ``measure``: every compressor of the catalogue over a ResNet-18 trace captured on the GPU, measured there
  (``arcsim run --measure-device cuda``: its kernel check, CUDA events beside the kernel model) and on the host's
  CPU (the same bytes and errors as the CUDA paths?), each run's wall; then LLaMA-60M live on the GPU (4 workers ×
  2 steps, every compressor) → measure.json; first, tests/test_cuda.py under pytest → cuda_tests.log.

Usage: python benchmarks/gpu_session.py --out DIR [--parts work,dense,compute,hook,measure] [--budget-s 420]
On a CPU (``--device cpu --quick``) it runs the same code at small sizes: a check of the script, not a measure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from packed_speed import median_ms

RESNET50_NUMEL = 25_557_032
DENSITIES = (0.001, 0.01, 0.1, 0.25, 0.5)
PEERS = (2, 8, 32, 64)
QSGD_LEVELS = 127  # 8-bit signed levels, as the benchmark suites' QSGD default


class Session:
    def __init__(self, out: Path, device: str, budget_s: float, quick: bool) -> None:
        self.out, self.device, self.quick = out, torch.device(device), quick
        self.start, self.budget_s = time.perf_counter(), budget_s
        self.deadline = self.start + budget_s

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def environment(self) -> dict:
        env = {"torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "device_type": self.device.type}
        if self.device.type == "cuda":
            env.update(device=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
        return env

    def write(self, name: str, data: dict) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / f".{name}.tmp"
        tmp.write_text(json.dumps({"environment": self.environment(), **data}, indent=1))
        tmp.replace(self.out / name)
        print(f"wrote {self.out / name} ({time.perf_counter() - self.start:.0f} s in)", flush=True)

    def median_ms(self, fn: Callable[[], object], repeats: int = 7) -> float:
        """Median milliseconds of ``fn`` after one warm-up: CUDA events on a GPU, the host clock on a CPU."""
        return median_ms(fn, self.device, repeats if not self.quick else 2)


# -- work: selection, decompression, quantisers and signs ------------------------------------------------
def dgc_select(x: torch.Tensor, k: int, sample: float = 0.01) -> torch.Tensor:
    """DGC's selection as its code runs it: the threshold of the top of a 1 % random sample, a mask, the indices
    above it, and a top-k among them when the sample let through more than 1.3 k."""
    importance = x.abs()
    n = x.numel()
    samples = importance[torch.randint(n, (max(1, int(n * sample)),), device=x.device)]
    kept = max(1, int(samples.numel() * k / n))
    threshold = torch.topk(samples, kept, sorted=False).values.min()
    indices = (importance >= threshold).nonzero().view(-1)
    if indices.numel() > 1.3 * k:
        indices = indices[torch.topk(importance[indices], k, sorted=False).indices]
    return indices


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    bits = (x >= 0).view(-1, 8).to(torch.uint8)
    return (bits << torch.arange(8, device=x.device, dtype=torch.uint8)).sum(1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor) -> torch.Tensor:
    bits = (packed[:, None] >> torch.arange(8, device=packed.device, dtype=torch.uint8)) & 1
    return bits.view(-1).to(torch.float32) * 2 - 1


def qsgd(x: torch.Tensor, levels: int = QSGD_LEVELS) -> tuple[torch.Tensor, torch.Tensor]:
    norm = x.norm()
    level = x.abs() / norm * levels
    floor = level.floor()
    q = floor + (torch.rand_like(x) < level - floor)
    return (q * x.sign()).to(torch.int8), norm


def terngrad(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = x.abs().max()
    keep = torch.rand_like(x) < x.abs() / scale
    return (x.sign() * keep).to(torch.int8), scale


def natural(x: torch.Tensor) -> torch.Tensor:
    mantissa, exponent = torch.frexp(x.abs())  # |x| = m · 2^e, m in [0.5, 1)
    up = torch.rand_like(x) < mantissa * 2 - 1
    return torch.ldexp(torch.ones_like(x), exponent - 1 + up.to(exponent.dtype)) * x.sign()


def per_peer_index_add(n: int, idx: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(n, device=idx.device)
    for i, v in zip(idx, val, strict=True):
        out.index_add_(0, i, v)
    return out


def dense_per_peer(n: int, idx: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """GRACE's decompression: each peer's sparse tensor scattered into a dense one of its own, then summed."""
    return sum(torch.zeros(n, device=idx.device).scatter_(0, i, v) for i, v in zip(idx, val, strict=True))


def work_part(s: Session) -> None:
    dev = s.device
    n_big = 1_000_003 * 8 if s.quick else RESNET50_NUMEL - RESNET50_NUMEL % 8
    sizes = (1 << 20, n_big)
    peers = (2, 8) if s.quick else PEERS
    gen = torch.Generator(device=dev).manual_seed(0)
    rows: list[dict] = []

    def add(kind: str, op: str, numel: int, ms: float, **extra: object) -> None:
        rows.append({"kind": kind, "op": op, "numel": numel, "ms": round(ms, 4), **extra})
        print(f"work {kind:10s} {op:22s} n={numel:>9d} {extra} {ms:9.3f} ms", flush=True)

    share = s.start + s.budget_s * 0.3  # leave the other parts their time
    for n in sizes:
        x = torch.randn(n, device=dev, generator=gen)
        add("pass", "read (sum)", n, s.median_ms(lambda x=x: x.sum()))
        add("pass", "copy", n, s.median_ms(lambda x=x: x.clone()))
        add("pass", "abs", n, s.median_ms(lambda x=x: x.abs()))
        add("select", "sort", n, s.median_ms(lambda x=x: torch.sort(x.abs(), descending=True)))
        for rho in DENSITIES:
            k = max(1, int(n * rho))
            add("select", "topk", n, s.median_ms(lambda x=x, k=k: torch.topk(x.abs(), k, sorted=False)), density=rho)
            add("select", "dgc-sampled", n, s.median_ms(lambda x=x, k=k: dgc_select(x, k)), density=rho)
            picked = torch.randint(n, (k,), device=dev, generator=gen)
            add("select", "gather values", n, s.median_ms(lambda x=x, i=picked: x[i]), density=rho)
        for name, fn in (("qsgd", lambda x=x: qsgd(x)), ("terngrad", lambda x=x: terngrad(x)),
                         ("natural", lambda x=x: natural(x)), ("sign pack", lambda x=x: pack_signs(x)),
                         ("efsign scale+pack", lambda x=x: (x.abs().mean(), pack_signs(x))),
                         ("fp16 cast", lambda x=x: x.half())):
            add("quantise", name, n, s.median_ms(fn))
        packed = pack_signs(x)
        add("quantise", "sign unpack", n, s.median_ms(lambda p=packed: unpack_signs(p)))
        q, norm = qsgd(x)
        add("quantise", "qsgd dequantise", n, s.median_ms(lambda q=q, norm=norm: q.float() * (norm / QSGD_LEVELS)))
        for p in peers:
            if time.perf_counter() > share:
                break
            many = packed.repeat(p, 1)
            add("quantise", "majority vote", n, s.median_ms(
                lambda m=many: torch.stack([unpack_signs(r) for r in m]).sum(0).sign()), peers=p)
            qs = q.repeat(p, 1)
            add("quantise", "qsgd sum peers", n, s.median_ms(lambda qs=qs: qs.float().sum(0)), peers=p)
        del x
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        s.write("work_times.json", {"method": "median of 7 after a warm-up, CUDA events; fp32 random normal data",
                                    "rows": rows})
    n = n_big
    for rho in DENSITIES:
        k = max(1, int(n * rho))
        for p in peers:
            if time.perf_counter() > share or p * k * 8 > 24e9:
                continue
            idx = torch.randint(n, (p, k), device=dev, generator=gen, dtype=torch.int64)
            val = torch.randn(p, k, device=dev, generator=gen)
            add("decompress", "index_add all peers", n, s.median_ms(
                lambda i=idx, v=val: torch.zeros(n, device=dev).index_add_(0, i.view(-1), v.view(-1))),
                density=rho, peers=p)
            add("decompress", "index_add per peer", n, s.median_ms(
                lambda i=idx, v=val: per_peer_index_add(n, i, v)), density=rho, peers=p)
            if p <= 32:
                add("decompress", "dense per peer + sum", n, s.median_ms(
                    lambda i=idx, v=val: dense_per_peer(n, i, v)), density=rho, peers=p)
            del idx, val
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        s.write("work_times.json", {"method": "median of 7 after a warm-up, CUDA events; fp32 random normal data; "
                                              "decompression indices uniform random (duplicates across peers)",
                                    "rows": rows})


# -- dense: gpu_measure's compression timings at high densities -----------------------------------------
def dense_part(s: Session) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import gpu_measure

    gpu_measure.COMPRESSORS = ("topk", "randk", "gaussiank", "arctopk", "star")
    gpu_measure.FLAT_SIZES = (100_000, 1_000_000, 4_000_000, 25_557_032)
    with tempfile.TemporaryDirectory() as tmp:
        gpu_measure.compress_part(Path(tmp), 5, ["resnet50"], (0.25, 0.5), flat=True)
        data = json.loads((Path(tmp) / "compress_times.json").read_text())
    s.write("compress_times_dense.json", data)


# -- compute: measured against the device model, and run --live on the GPU -------------------------------
COMPUTE = (("llama_60m", (8, 32), ("bf16",)), ("gpt2_small", (8, 32), ("bf16",)), ("llama_60m", (8,), ("fp32",)),
           ("resnet50", (32,), ("fp32",)), ("resnet50", (64,), ("bf16",)))


def arcsim(*args: str, timeout: float) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "arcsim", *args], capture_output=True, text=True,
                              timeout=max(5.0, timeout))
        return done.returncode, (done.stdout + done.stderr)[-2000:], time.perf_counter() - t0
    except subprocess.TimeoutExpired:
        return 124, "timed out", time.perf_counter() - t0


def gpu_name() -> str:
    name = torch.cuda.get_device_name(0).lower() if torch.cuda.is_available() else "cpu"
    return next((g for g in ("h200", "h100", "a100", "b200") if g in name), "h100")


def warm_clocks(seconds: float = 5.0) -> None:
    """Matrix products for a few seconds, so the first profile is not taken at idle clocks."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a @ a
        torch.cuda.synchronize()


def compute_part(s: Session) -> None:
    rows, runs = [], []
    gpu = gpu_name()
    if s.device.type == "cuda":
        warm_clocks()
    with tempfile.TemporaryDirectory() as tmp:
        for model, batches, precisions in COMPUTE:
            for batch in batches[:1] if s.quick else batches:
                for precision in precisions[:1] if s.quick else precisions:
                    if s.left() < 60:
                        break
                    prof, pred = Path(tmp) / "profile.json", Path(tmp) / "predict.json"
                    flags = ["--bf16"] if precision == "bf16" else []
                    rc, log, wall = arcsim("trace", "profile", "--model", model, "--device", s.device.type, "-b",
                                           str(batch), "-o", str(prof), "--repeats", "2" if s.quick else "20",
                                           "--warmup", "2" if s.quick else "10",
                                           *flags, timeout=min(120, s.left() - 30))
                    rc2, log2, _ = arcsim("device", "predict", "--model", model, "--gpu", gpu, "-b", str(batch),
                                          "--precision", precision, "--modelled", "--json", str(pred), timeout=60)
                    row: dict = {"model": model, "batch": batch, "precision": precision, "profile_rc": rc,
                                 "profile_wall_s": round(wall, 1)}
                    if rc == 0:
                        measured = json.loads(prof.read_text())
                        row.update(measured_forward_ms=measured["forward_s"] * 1e3,
                                   measured_backward_ms=measured["backward_s"] * 1e3)
                    else:
                        row["profile_log"] = log
                    if rc2 == 0:
                        predicted = json.loads(pred.read_text())
                        row.update(modelled_forward_ms=predicted["forward_s"] * 1e3,
                                   modelled_backward_ms=predicted["backward_s"] * 1e3, gpu=gpu)
                    else:
                        row["predict_log"] = log2
                    rows.append(row)
                    print("compute", json.dumps({k: v for k, v in row.items() if not k.endswith("log")}), flush=True)
                    s.write("compute.json", {"rows": rows, "runs": runs})
        topology = f"4x8-eth25-{gpu}" if s.device.type == "cuda" else "4x8-eth25-a100"
        for model in ("llama_60m", "resnet50"):
            if s.left() < 60:
                break
            result = Path(tmp) / f"run-{model}.json"
            rc, log, wall = arcsim("run", "-t", topology, "--live", "--model", model, "-w", "4", "--steps", "2",
                                   "--device", s.device.type, "-c", "dense,topk,randk", "--json", str(result),
                                   timeout=min(240, s.left() - 20))
            run: dict = {"model": model, "topology": topology, "rc": rc, "wall_s": round(wall, 1)}
            if rc == 0:
                data = json.loads(result.read_text())
                keep = ("compressor", "collective", "density", "compute_s", "effects_s", "compress_s", "comm_s",
                        "iteration_s")
                run["candidates"] = [{k: c.get(k) for k in keep} for c in [data["dense"], *data["candidates"]]]
                run["recommendation"] = data["recommendation"]
                run["timings_s"] = data["timings_s"]
            else:
                run["log"] = log
            runs.append(run)
            print("run --live", json.dumps({k: v for k, v in run.items() if k != "log"})[:400], flush=True)
            s.write("compute.json", {"rows": rows, "runs": runs})


# -- hook: a user's torchrun job recording under NCCL -----------------------------------------------------
def users_job(where: Path, backend: str, cuda: bool) -> str:
    """tests/_users_job.py's training script, for ``backend`` and on the GPU when ``cuda``."""
    job = (where / "train.py").read_text().replace('init_process_group("gloo")', f'init_process_group("{backend}")')
    if cuda:
        job = (job.replace("model = DDP(build())", "torch.cuda.set_device(0)\nmodel = DDP(build().cuda())")
               .replace("generator=gen)", "generator=gen).cuda()")
               .replace('torch.autocast("cpu"', 'torch.autocast("cuda"'))
    return job


def hook_part(s: Session) -> None:
    """NCCL on one GPU runs one rank (it refuses two ranks on one device): that rank records; two gloo ranks on the
    same GPU record a trace that merges and is priced."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
    from _users_job import write_users_job

    cuda = s.device.type == "cuda"
    jobs = [("nccl", 1), ("gloo", 2)] if cuda else [("gloo", 2)]
    results = []
    for backend, ranks in jobs:
        with tempfile.TemporaryDirectory() as tmp:
            where = Path(tmp)
            write_users_job(where)
            (where / "train.py").write_text(users_job(where, backend, cuda))
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(where), os.environ.get("PYTHONPATH", "")])}
            t0 = time.perf_counter()
            job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
                                  "train.py"], cwd=where, env=env, capture_output=True, text=True, timeout=180)
            result: dict = {"backend": backend, "ranks": ranks, "device": s.device.type, "job_rc": job.returncode,
                            "job_wall_s": round(time.perf_counter() - t0, 1),
                            "parts": sorted(p.name for p in where.glob("rank*.pt"))}
            if job.returncode != 0:
                result["job_log"] = (job.stdout + job.stderr)[-3000:]
            elif ranks > 1:
                cwd = os.getcwd()
                os.chdir(where)
                try:
                    rc, log, _ = arcsim("trace", "merge", *result["parts"], "--model", "my_gpt.py:build",
                                        "-o", "t.npz", timeout=120)
                    result.update(merge_rc=rc, merge_log=log[-800:])
                    if rc == 0:
                        rc, log, wall = arcsim("run", "-t", f"2x8-eth25-{gpu_name()}", "--trace", "t.npz", "-c",
                                               "dense,topk", "--json", "priced.json", timeout=180)
                        result.update(run_rc=rc, run_wall_s=round(wall, 1), run_log=log[-800:])
                        if rc == 0:
                            result["priced"] = json.loads(Path("priced.json").read_text())["recommendation"]
                finally:
                    os.chdir(cwd)
            results.append(result)
            print("hook", json.dumps({k: v for k, v in result.items() if not k.endswith("log")})[:300], flush=True)
    s.write("hook.json", {"jobs": results})


# -- measure: the catalogue's compressors on the GPU, beside the kernel model and the CPU ---------------------------
def run_json(path: Path, *args: str, timeout: float) -> dict:
    """``arcsim run ... --json path``: its exit code, wall seconds, and what it wrote (or its log's tail)."""
    rc, log, wall = arcsim("run", *args, "--json", str(path), timeout=timeout)
    out: dict = {"rc": rc, "wall_s": round(wall, 1)}
    if rc != 0:
        out["log"] = log
        return out
    data = json.loads(path.read_text())
    keep = ("compressor", "collective", "density", "memory", "compress_s", "rel_error", "bytes_per_rank")
    out.update(candidates=[{k: c.get(k) for k in keep} for c in data["candidates"]],
               kernel_check=data.get("kernel_check"), timings_s=data["timings_s"])
    return out


def measure_part(s: Session) -> None:
    from arcsim.catalog import COMPRESSORS

    every = ",".join(c for c in COMPRESSORS if c != "dense")
    quick = ["--ratios", "0.01", "--policy", "none", "-c", every, "--exact"]
    result: dict = {"compressors": every}
    if s.left() > 120:  # first: each compressor on its own, before one run of them all
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                                "tests/test_cuda.py", "tests/test_kernel_check.py"], capture_output=True, text=True,
                               timeout=min(180.0, s.left() - 60), cwd=Path(__file__).parents[1])
        s.out.mkdir(parents=True, exist_ok=True)
        (s.out / "cuda_tests.log").write_text(tests.stdout + tests.stderr)
        print(f"tests/test_cuda.py: exit {tests.returncode}\n{tests.stdout[-1500:]}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "resnet18.npz"
        model, workers = ("cnn", 2) if s.quick else ("resnet18", 4)
        rc, log, wall = arcsim("trace", "capture", "--model", model, "-w", str(workers), "-s", "2",
                               "--device", s.device.type, "-o", str(trace), timeout=min(240, s.left() - 60))
        result["capture"] = {"model": model, "workers": workers, "rc": rc, "wall_s": round(wall, 1),
                             **({"log": log} if rc else {})}
        print("measure capture", json.dumps(result["capture"])[:300], flush=True)
        topology = f"4x8-eth25-{gpu_name()}"
        runs = [(s.device.type, ["--trace", str(trace), "--measure-device", s.device.type])] if rc == 0 else []
        if s.device.type == "cuda":  # LLaMA-60M live on the GPU, then the trace's CUDA paths beside the CPU's
            runs.append(("live_llama_60m", ["--live", "--model", "llama_60m", "-w", "4", "--steps", "2",
                                            "--device", "cuda"]))
            runs += [("cpu", ["--trace", str(trace), "--measure-device", "cpu"])] if rc == 0 else []
        for name, args in runs:
            if s.left() < 60:
                break
            result[name] = got = run_json(Path(tmp) / f"run-{name}.json", "-t", topology, *args, *quick,
                                          timeout=min(300, s.left() - 30))
            print(f"measure {name}", json.dumps({k: v for k, v in got.items() if k in ("rc", "wall_s", "log")}),
                  flush=True)
            s.write("measure.json", result)

PARTS = {"work": work_part, "dense": dense_part, "hook": hook_part, "compute": compute_part, "measure": measure_part}
ARGS: argparse.Namespace


def main() -> None:
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="small sizes: a check of the script on a CPU")
    ARGS = ap.parse_args()
    parts = ARGS.parts.split(",")
    if unknown := set(parts) - set(PARTS):
        sys.exit(f"error: unknown parts {sorted(unknown)}; choose from {', '.join(PARTS)}")
    if ARGS.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: no CUDA device; give --device cpu --quick to check the script on a CPU")
    s = Session(ARGS.out, ARGS.device, ARGS.budget_s, ARGS.quick)
    print(json.dumps(s.environment()), flush=True)
    for name in parts:
        if s.left() < 20:
            print(f"skipped {name}: budget spent", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            PARTS[name](s)
        except Exception as exc:  # one part failing must not lose the others' results
            print(f"part {name} failed: {type(exc).__name__}: {exc}", flush=True)
        print(f"part {name}: {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
