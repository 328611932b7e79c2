"""Measurements only a GPU can give, written as small JSON files for the device model to anchor on.

Parts (``--parts``, comma-separated):
- ``compute``: forward, backward and per-parameter gradient-ready times of the zoo's models
  (arcsim.traces.timing.measure_profile: CUDA events, median of the timed iterations), fp32 and bf16
  autocast, at each ``--batches``; one file per case in arcsim's compute-profile format.
- ``compress``: each compressor's local work for one rank (SoloComm, P = 8; STAR as leader and not),
  CUDA events around ``compress``, median of ``--repeats``: flat vectors of several sizes and every DDP
  bucket (25 MB) of ResNet-50 with its real layer layout, at densities 0.001, 0.01, 0.1; plus the
  primitive passes the cost model is written in (one read pass, a copy, torch.topk of |x|).
- ``ddp``: one-rank DDP iterations of ResNet-50 (NCCL, world size 1) with each compressor's comm hook,
  with DDP's own all-reduce and with a hook that communicates nothing: compute + compression on the GPU,
  the part a network cannot hide.
- ``roofline``: GEMM throughput by size (fp32, tf32, bf16), streaming-kernel bandwidth by size, and the
  cost of one tiny kernel launch: the anchors of a device model's roofline.

Usage: python benchmarks/gpu_measure.py --out DIR [--parts compute,compress,ddp] [--batches 32,64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from arcsim.catalog import INFO
from arcsim.comm.solo import SoloComm
from arcsim.compressors.layout import layout_of
from arcsim.compressors.registry import make_compressor
from arcsim.models import loss_fn, model_entry
from arcsim.models.datasets import make_dataset
from arcsim.traces.timing import measure_profile

COMPRESSORS = ("dense", "fp16", "topk", "randk", "gaussiank", "arctopk", "star", "var", "powersgd")
DENSITIES = (0.001, 0.01, 0.1)
FLAT_SIZES = (100_000, 1_000_000, 4_000_000, 25_557_032)
BUCKET_BYTES = 25 * 2**20


def environment() -> dict:
    return {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_precision": torch.get_float32_matmul_precision(),
            "date": time.strftime("%Y-%m-%d")}


def write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
    print(f"wrote {path}", flush=True)


# -- compute ------------------------------------------------------------------------------------------
COMPUTE_CASES = {"resnet18": "synthetic-images", "resnet50": "synthetic-images", "vit_b_16": "synthetic-images",
                 "gpt2_small": "synthetic-tokens", "cnn": "digits", "mlp_wide": "digits"}


def compute_part(out: Path, batches: list[int]) -> None:
    rows = []
    for model, dataset in COMPUTE_CASES.items():
        for batch in batches:
            for bf16 in (False, True):
                t0 = time.perf_counter()
                prof = measure_profile(model, batch, "cuda", dataset=dataset, repeats=10, warmup=3, bf16=bf16)
                data = prof.to_json()
                data["extra"]["environment"] = environment()
                precision = "bf16" if bf16 else "fp32"
                write(out / "profiles" / f"{model}-b{batch}-{precision}.json", data)
                rows.append((model, batch, precision, prof.forward_s * 1e3, prof.backward_s * 1e3,
                             time.perf_counter() - t0))
                torch.cuda.empty_cache()
    for model, batch, precision, fwd, bwd, took in rows:
        print(f"compute {model:10s} b{batch:<3d} {precision} fwd {fwd:.2f} ms bwd {bwd:.2f} ms ({took:.0f} s)",
              flush=True)


# -- compression ---------------------------------------------------------------------------------------
def cuda_median(fn, repeats: int) -> tuple[float, float]:
    """(median seconds by CUDA events, median seconds by host clock after a synchronize)."""
    fn()
    torch.cuda.synchronize()
    events, host = [], []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        host.append(time.perf_counter() - t0)
        events.append(a.elapsed_time(b) / 1e3)
    return statistics.median(events), statistics.median(host)


def model_buckets(name: str) -> list[tuple[int, tuple]]:
    """A zoo model's parameters in reverse registration order (≈ backward order) packed into 25 MB buckets."""
    entry = model_entry(name)
    model = entry.build(make_dataset(COMPUTE_CASES.get(name, entry.default_dataset)).spec)
    params = [tuple(p.shape) for p in model.parameters()][::-1]
    buckets, current, size = [], [], 0
    for shape in params:
        n = 1
        for s in shape:
            n *= s
        if current and (size + n) * 4 > BUCKET_BYTES:
            buckets.append(current)
            current, size = [], 0
        current.append(shape)
        size += n
    buckets.append(current)
    return [(sum(_numel(s) for s in b), layout_of(b)) for b in buckets]


def _numel(shape: tuple) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def compress_part(out: Path, repeats: int, models: list[str], densities: tuple[float, ...], flat: bool) -> None:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    cases = [(f"flat-{d}", d, None) for d in FLAT_SIZES] if flat else []
    cases += [(f"{m}-bucket{i}", d, layout) for m in models for i, (d, layout) in enumerate(model_buckets(m))]
    rows, primitives = [], []
    for label, d, layout in cases:
        x = torch.randn(1, d, device=dev, generator=gen)
        read, _ = cuda_median(lambda x=x: x.abs().amax(), repeats)
        copy, _ = cuda_median(lambda x=x: x.clone(), repeats)
        for rho in densities:
            k = max(1, int(rho * d))
            topk, _ = cuda_median(lambda x=x, k=k: x[0].abs().topk(k, sorted=False), repeats)
            primitives.append({"case": label, "numel": d, "density": rho, "read_ms": read * 1e3,
                               "copy_ms": copy * 1e3, "topk_ms": topk * 1e3})
            for name in COMPRESSORS:
                if name in ("dense", "fp16") and rho != densities[len(densities) // 2]:
                    continue
                roles = [("", False)] if name != "star" else [("leader", True), ("other", False)]
                scopes = ("tensor", "bucket") if layout is not None and "scope" in INFO[name].options else (None,)
                variants = [(f"{role}{'/' if role and scope else ''}{scope or ''}", leader, scope)
                            for role, leader in roles for scope in scopes]
                for variant, leader, scope in variants:
                    comm = SoloComm(8, leader=leader)
                    comp = make_compressor(name, rho, seed=0, **({"scope": scope} if scope else {}))
                    step = [1]

                    def run(comp=comp, x=x, comm=comm, layout=layout, step=step):
                        comp.compress(x, comm, step[0], layout)
                        step[0] = step[0] % 7 + 1

                    try:
                        ev, host = cuda_median(run, repeats)
                    except Exception as exc:  # report, keep measuring the rest
                        print(f"compress {label} {name} {rho}: failed: {exc}", flush=True)
                        continue
                    records = len(comm.log.records) // (repeats + 1)
                    rows.append({"case": label, "numel": d, "layers": len(layout) if layout else 1,
                                 "compressor": name, "variant": variant, "scope": scope, "density": rho,
                                 "ms": ev * 1e3, "host_ms": host * 1e3, "log_records": records})
                    print(f"compress {label:18s} {name:9s} {variant:13s} ρ={rho:<5} {ev * 1e3:8.3f} ms", flush=True)
        del x
        torch.cuda.empty_cache()
    stem = "compress_times" if models == ["resnet50"] else f"compress_times-{'-'.join(models)}"
    write(out / f"{stem}.json", {"models": models,"environment": environment(), "repeats": repeats,
                                        "method": "CUDA events around Compressor.compress on one rank "
                                                  "(SoloComm, P = 8), median after one warm-up call",
                                        "primitives": primitives, "compressors": rows})


# -- roofline anchors ------------------------------------------------------------------------------------
def roofline_part(out: Path, repeats: int) -> None:
    """What the device model's roofline is written in: matrix-multiply throughput by size and precision,
    memory bandwidth of streaming kernels by size, and the cost of one tiny kernel (launch overhead)."""
    dev = torch.device("cuda")
    gemm = []
    for precision in ("fp32", "tf32", "bf16"):
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        for n in (256, 512, 1024, 2048, 4096, 8192):
            a = torch.randn(n, n, device=dev, dtype=dtype)
            b = torch.randn(n, n, device=dev, dtype=dtype)
            t, _ = cuda_median(lambda a=a, b=b: a @ b, repeats)
            tflops = 2 * n**3 / t / 1e12
            gemm.append({"precision": precision, "n": n, "ms": t * 1e3, "tflops": tflops})
            print(f"roofline gemm {precision} n={n:5d} {t * 1e3:8.3f} ms {tflops:7.1f} TFLOP/s", flush=True)
            del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    stream = []
    for numel in (2**16, 2**18, 2**20, 2**22, 2**24, 2**26, 2**28):
        x = torch.randn(numel, device=dev)
        z = torch.randn(numel, device=dev)
        y = torch.empty_like(x)
        for kind, fn, moved in (("copy", lambda x=x, y=y: y.copy_(x), 8),
                                ("add", lambda x=x, y=y, z=z: torch.add(x, z, out=y), 12),
                                ("read (amax)", lambda x=x: x.abs().amax(), 8)):
            t, _ = cuda_median(fn, repeats)
            stream.append({"kernel": kind, "numel": numel, "ms": t * 1e3,
                           "bytes_per_element": moved, "gbps": moved * numel / t / 1e9})
            print(f"roofline {kind:12s} n=2^{numel.bit_length() - 1:<2d} {t * 1e3:8.4f} ms "
                  f"{moved * numel / t / 1e9:8.1f} GB/s", flush=True)
        del x, y, z
    tiny = torch.zeros(1, device=dev)
    launches = 1000

    def many() -> None:
        for _ in range(launches):
            tiny.add_(1.0)

    t, host = cuda_median(many, max(3, repeats // 4))
    launch = {"launches": launches, "gpu_us_per_launch": t / launches * 1e6,
              "host_us_per_launch": host / launches * 1e6}
    print(f"roofline launch: {launch}", flush=True)
    write(out / "roofline.json", {"environment": environment(), "repeats": repeats,
                                  "method": "CUDA events, median after one warm-up; GEMM n×n×n, 2n³ FLOP; "
                                            "streaming kernels counted by bytes read + written per element",
                                  "gemm": gemm, "stream": stream, "launch": launch})


# -- one-rank DDP with each hook -----------------------------------------------------------------------
def ddp_part(out: Path, repeats: int, batch: int) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from arcsim.hooks import CompressionState, compression_hook

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    dev = torch.device("cuda")
    entry = model_entry("resnet50")
    ds = make_dataset("synthetic-images")
    x, y = (t.to(dev) for t in ds.draw(batch, torch.Generator().manual_seed(0)))

    def no_comm(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    variants = [("ddp-allreduce", None), ("no-communication", "none")] + [(c, c) for c in COMPRESSORS]
    rows = []
    for label, hook in variants:
        for precision in ("fp32", "bf16"):
            torch.manual_seed(0)
            model = DDP(entry.build(ds.spec).to(dev), device_ids=[0])
            if hook == "none":
                model.register_comm_hook(None, no_comm)
            elif hook is not None:
                model.register_comm_hook(CompressionState(hook, density=0.01, memory="ef14"), compression_hook)
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

            def step(model=model, opt=opt, precision=precision):
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
                    loss = loss_fn("image", model(x), y)
                loss.backward()
                opt.step()

            for _ in range(5):
                step()
            ev, host = cuda_median(step, repeats)
            rows.append({"hook": label, "precision": precision, "batch": batch, "density": 0.01,
                         "memory": "ef14" if hook not in (None, "none") else None,
                         "iteration_ms": ev * 1e3, "host_ms": host * 1e3})
            print(f"ddp {label:18s} {precision} {ev * 1e3:8.2f} ms (host {host * 1e3:.2f})", flush=True)
            del model, opt
            torch.cuda.empty_cache()
    dist.destroy_process_group()
    write(out / "ddp_hook_steps.json", {"environment": environment(), "model": "resnet50", "repeats": repeats,
                                        "method": "one-rank DDP (NCCL), SGD momentum 0.9, forward + backward "
                                                  "+ optimizer step, CUDA events, median after 5 warm-up",
                                        "rows": rows})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--parts", default="compute,compress,ddp")
    ap.add_argument("--batches", default="32,64")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--models", default="resnet50", help="compress: zoo models whose DDP buckets are timed")
    ap.add_argument("--densities", default=",".join(map(str, DENSITIES)))
    ap.add_argument("--no-flat", action="store_true", help="compress: skip the flat vectors")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device; this benchmark measures a GPU")
    parts = args.parts.split(",")
    print(json.dumps(environment()), flush=True)
    if "compute" in parts:
        compute_part(args.out, [int(b) for b in args.batches.split(",")])
    if "compress" in parts:
        compress_part(args.out, args.repeats, args.models.split(","),
                      tuple(float(d) for d in args.densities.split(",")), not args.no_flat)
    if "roofline" in parts:
        roofline_part(args.out, args.repeats)
    if "ddp" in parts:
        ddp_part(args.out, args.repeats, 64)


if __name__ == "__main__":
    main()
