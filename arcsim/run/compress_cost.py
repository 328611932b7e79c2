"""Compression time on the critical path: measured on this machine, or modelled for a GPU profile.

When the compute times come from a CPU (the trace's own capture), the compressor's measured wall time
per rank is used. When they come from a GPU profile, running the compressor on this CPU says nothing
about the GPU, so the time is modelled: memory passes per element × the device's read-pass cost.
Measured on an H100 (torch 2.11, fp32, median of 20): one read pass of 25.6 M elements 0.122 ms;
torch.topk 0.66–0.69 ms ≈ 5.5 passes; Gaussian-k 0.36–0.41 ms ≈ 3.2; 64-block norms + top-k of blocks
0.21–0.25 ms ≈ 1.9. The pass counts live in each compressor's descriptor (arcsim.catalog); the others
are our estimates, not measurements: ARC-Top-K = block
selection + the sketch projection (≈ 1.5 more); Rand-K, fp16 and PowerSGD from the passes their
kernels make. Kernel launches add a fixed cost per collective phase. Replace with a GPU benchmark
(benchmarks/compress_speed.py --device cuda) when one is run.
"""

from __future__ import annotations

from arcsim.catalog import INFO

READ_PASS_S_PER_ELEMENT = {"cuda": 0.122e-3 / 25.6e6}
LAUNCH_S = 10e-6


def modelled(compressor: str, numel: int, phases: int, device: str) -> float:
    """Seconds of local work for one bucket of ``numel`` elements on ``device`` (a GPU kind)."""
    per = READ_PASS_S_PER_ELEMENT.get(device, READ_PASS_S_PER_ELEMENT["cuda"])
    return INFO[compressor].gpu_passes * numel * per + LAUNCH_S * phases
