"""DGC and 1-bit Adam's compressed all-reduce, each against a reference written here in plain torch from the paper and
the reference code's semantics (synxlin/deep-gradient-compression's DGCCompressor + DGCSGDMemory + DGCSGD; DeepSpeed's
NcclBackend.compressed_allreduce), value for value on the same tensors and seeds; and the all-to-all they need."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import flat

from arcsim.catalog import INFO, memory_for
from arcsim.collectives import build
from arcsim.comm.inprocess import InProcessComm
from arcsim.comm.log import on_ranks
from arcsim.comm.solo import SoloComm
from arcsim.compressors.dgc import DGC
from arcsim.compressors.layout import layout_of
from arcsim.compressors.onebit import OneBit, pack_signs, unpack_signs
from arcsim.compressors.registry import make_compressor
from arcsim.errors import CompressionError
from arcsim.netsim import analytic
from arcsim.pricing import plan, price_records

P = 4
MASK = 0x7FFF_FFFF_FFFF_FFFF


def steps(seed: int, d: int, count: int = 3, workers: int = P) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shared = torch.randn(d, generator=gen)
    return [shared * (1 + 0.3 * t) + torch.randn(workers, d, generator=gen) for t in range(count)]


# -- DGC: the reference, re-derived --------------------------------------------------------------------------------
def ref_initialize(numel: int, ratio: float, sample_ratio: float = 0.01) -> tuple[int, int, int, int]:
    """DGCCompressor.initialize: (num_selects, num_samples, top_k_samples, sample_stride)."""
    pct_numel = math.ceil(numel * sample_ratio)
    cpr_numel = math.ceil(2 / ratio)
    if numel <= cpr_numel:
        sample_stride, num_samples = 1, numel
    else:
        sample_stride = math.ceil(numel / max(pct_numel, cpr_numel) / 32) * 32 + 1
        num_samples = numel // sample_stride
        while num_samples < max(pct_numel, cpr_numel):
            sample_stride -= 8
            num_samples = numel // sample_stride
    return math.ceil(numel * ratio), num_samples, math.ceil(num_samples * ratio), sample_stride


def ref_sparsify(vel: torch.Tensor, ratio: float, seed: int, step: int, offset: int, strided: bool) -> torch.Tensor:
    """DGCCompressor._sparsify on one worker's velocity of one layer; the sample's random start (or positions) from
    the generator arcsim documents: (seed, step, layer offset), the same for every worker."""
    numel = vel.numel()
    num_selects, num_samples, top_k_samples, sample_stride = ref_initialize(numel, ratio)
    importance = vel.abs()
    if numel == num_samples:
        samples = importance
    else:
        gen = torch.Generator().manual_seed(hash((seed, step, offset)) & MASK)
        if strided:
            start = int(torch.randint(sample_stride, (1,), generator=gen))
            samples = importance[start::sample_stride]
        else:
            samples = importance[torch.randint(numel, (num_samples,), generator=gen)]
    threshold = torch.min(torch.topk(samples, top_k_samples, 0, largest=True, sorted=False)[0])
    indices = torch.ge(importance, threshold).nonzero().view(-1)
    if numel > num_samples:
        for _ in range(10):
            n = indices.numel()
            if n > num_selects:
                if n > num_selects * 1.3:
                    indices = indices[torch.topk(importance[indices], num_selects, 0, largest=True, sorted=False)[1]]
                    break
                break
            elif n < 0.8 * num_selects:
                threshold = threshold * 0.8
            else:
                break
            indices = torch.ge(importance, threshold).nonzero().view(-1)
    return indices[:num_selects]


def ref_dgc(grads: list[torch.Tensor], layers: list[tuple[tuple[int, ...], int]], rho: float, seed: int,
            momentum: float = 0.9, clip: float | None = None, strided: bool = True, masking: bool = True,
            warmup: int = 0):
    """The reference's step per worker and layer: (update a_t per step, sent indices per step [worker][layer],
    momentum and velocity per worker at the end)."""
    workers, d = grads[0].shape
    mmt = torch.zeros(workers, d)
    vel = torch.zeros(workers, d)
    dense_mmt = torch.zeros(d)  # 1-D layers: momentum of the all-reduced mean (compensate without accumulation)
    updates, sent = [], []
    for t, g in enumerate(grads):
        ratio = max((rho ** (1 / (warmup + 1))) ** (t + 1), rho) if t < warmup else rho
        update = torch.zeros(d)
        picked: list[list[torch.Tensor]] = [[] for _ in range(workers)]
        for shape, off in layers:
            n = math.prod(shape)
            if len(shape) < 2:
                avg = g[:, off:off + n].mean(0)
                if clip is not None:  # the memory's clipping, on the all-reduced mean
                    coef = clip / math.sqrt(workers) / (avg.norm() + 1e-6)
                    if coef < 1:
                        avg = avg * coef
                dense_mmt[off:off + n] = dense_mmt[off:off + n] * momentum + avg
                update[off:off + n] = dense_mmt[off:off + n]
                continue
            total = torch.zeros(n)
            for w in range(workers):
                grad = g[w, off:off + n].clone()
                if clip is not None:  # clip_grad_norm_ with the paper's N^-1/2 threshold
                    coef = clip / math.sqrt(workers) / (grad.norm() + 1e-6)
                    if coef < 1:
                        grad = grad * coef
                mmt[w, off:off + n] = mmt[w, off:off + n] * momentum + grad
                vel[w, off:off + n] += mmt[w, off:off + n]
                indices = ref_sparsify(vel[w, off:off + n], ratio, seed, t, off, strided)
                total.index_put_([indices], vel[w, off:off + n][indices], accumulate=True)
                if masking:
                    mmt[w, off:off + n][indices] = 0
                vel[w, off:off + n][indices] = 0
                picked[w].append(indices + off)
            update[off:off + n] = total / workers
        updates.append(update)
        sent.append(picked)
    return updates, sent, mmt, vel


def recording(comp: DGC) -> list[torch.Tensor]:
    """The indices each call hands to its all-gather, [W, K] per step (padding included)."""
    seen: list[torch.Tensor] = []
    original = comp.gather

    def gather(comm, vals, idx):
        seen.append(idx.clone())
        return original(comm, vals, idx)

    comp.gather = gather  # type: ignore[method-assign]
    return seen


SHAPES = [(40, 100), (64,), (30, 50), (10,), (7, 3)]  # sampled layers, biases, and a small one thresholded whole


@pytest.mark.parametrize(("strided", "clip", "masking"), [(True, None, True), (False, 2.0, True), (True, 1.0, False)])
def test_dgc_matches_the_reference_value_for_value(strided, clip, masking):
    layout = layout_of(SHAPES)
    d = sum(math.prod(s) for s in SHAPES)
    grads = steps(1, d)
    rho, seed = 0.01, 5
    comp = DGC(rho, seed=seed, clip_norm=clip, strided=strided, masking=masking)
    seen, comm = recording(comp), InProcessComm(P)
    outs = [comp.compress(g, comm, t, layout) for t, g in enumerate(grads)]
    updates, sent, mmt, vel = ref_dgc(grads, [(la.shape, la.offset) for la in layout], rho, seed, clip=clip,
                                      strided=strided, masking=masking)
    for t in range(len(grads)):
        torch.testing.assert_close(outs[t].aggregate[0], updates[t], rtol=1e-5, atol=1e-6)
        for w in range(P):
            mine = seen[t][w, :int(outs[t].selected[w]) - 74]  # the sent indices (74 elements of biases go dense)
            assert torch.equal(mine.sort().values, torch.cat(sent[t][w]).sort().values), (t, w)
    u, v, _ = comp.state(P, d, torch.device("cpu"))
    torch.testing.assert_close(u, mmt, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v, vel, rtol=1e-5, atol=1e-6)
    assert [r.tag for r in comm.log.records[:2]] == ["values+indices", "dense"]


def test_dgc_warm_up_follows_the_reference_schedule_the_paper_s_densities():
    comp = DGC(0.001, warmup_steps=4)
    ratios = [comp.ratio_at(s, 0.001) for s in range(6)]
    for got, paper in zip(ratios, (0.25, 0.0625, 0.015625, 0.004, 0.001, 0.001), strict=True):
        assert got == pytest.approx(paper, rel=0.02)
    assert DGC(0.001, warmup_steps=4, warmup_coeff=0.25).ratio_at(1, 0.001) == 0.0625
    layout = layout_of([(50, 100)])
    grads = steps(2, 5000, count=4)
    comp = DGC(0.01, seed=1, warmup_steps=3)
    comm = InProcessComm(P)
    outs = [comp.compress(g, comm, t, layout) for t, g in enumerate(grads)]
    updates, _, _, _ = ref_dgc(grads, [((50, 100), 0)], 0.01, 1, warmup=3)
    for out, ref in zip(outs, updates, strict=True):
        torch.testing.assert_close(out.aggregate[0], ref, rtol=1e-5, atol=1e-6)
    counts = [int(out.selected.max()) for out in outs]
    assert counts[0] > counts[1] > counts[2] > counts[3] == 50  # ⌈n·ratio⌉ at most, then ρ's k


def test_dgc_selects_about_k_and_masks_what_it_sent():
    n, rho = 200_000, 0.001
    k = math.ceil(n * rho)
    x = torch.randn(P, n, generator=torch.Generator().manual_seed(3))
    for masking in (True, False):
        comp, comm = DGC(rho, seed=2, masking=masking), InProcessComm(P)
        seen = recording(comp)
        out = comp.compress(x, comm, 0)
        assert ((out.selected >= 0.8 * k) & (out.selected <= k)).all(), out.selected
        u, v, _ = comp.state(P, n, torch.device("cpu"))
        for w in range(P):
            idx = seen[0][w, :int(out.selected[w])]
            assert (v[w, idx] == 0).all()  # the velocity sent is gone
            assert (u[w, idx] == 0).all() == masking  # momentum factor masking
            kept = torch.ones(n, dtype=torch.bool)
            kept[idx] = False
            assert torch.equal(v[w, kept], x[w, kept]) and (v[w, kept] != 0).all()
            # what was sent is among the worker's ⌊1.3·k⌋ + 1 largest (at most 1.3·k pass the threshold kept)
            assert float(x[w, idx].abs().min()) >= float(x[w].abs().topk(int(1.3 * k) + 1).values.min())


def test_dgc_returned_to_a_momentum_sgd_is_dgcsgd_on_dgc_s_update():
    """optimizer_momentum=True returns a_t − m·a_{t−1}; torch's SGD(momentum=m, weight_decay) fed that steps exactly as
    the reference's DGCSGD (its momentum on the weight decay alone) fed a_t."""
    layout = layout_of([(20, 30), (30,)])
    grads = steps(4, 630, count=4)
    plain = DGC(0.05, seed=3)
    folded = DGC(0.05, seed=3, optimizer_momentum=True)
    comm = InProcessComm(P)
    p_sgd = torch.nn.Parameter(torch.linspace(-1, 1, 630))
    p_ref = torch.linspace(-1, 1, 630)
    sgd = torch.optim.SGD([p_sgd], lr=0.1, momentum=0.9, weight_decay=0.01)
    buf = torch.zeros(630)
    last = torch.zeros(630)
    for t, g in enumerate(grads):
        a = plain.compress(g, comm, t, layout).aggregate[0]
        r = folded.compress(g, comm, t, layout).aggregate[0]
        torch.testing.assert_close(r, a - 0.9 * last, rtol=1e-5, atol=1e-6)
        last = a
        p_sgd.grad = r.clone()
        sgd.step()
        buf = buf * 0.9 + 0.01 * p_ref if t else 0.01 * p_ref  # DGCSGD: momentum of the decay, then + a_t
        p_ref = p_ref - 0.1 * (buf + a)
        torch.testing.assert_close(p_sgd.detach(), p_ref, rtol=1e-5, atol=1e-6)
    assert [r.tag for r in comm.log.records[:2]] == ["values+indices", "dense"]


def test_dgc_refuses_bad_options():
    for kwargs, message in (({"momentum": 1.0}, "momentum"), ({"sample_ratio": 0.001}, "sample_ratio"),
                            ({"clip_norm": 0.0}, "clip_norm"), ({"warmup_steps": -1}, "warmup_steps"),
                            ({"warmup_coeff": 1.5}, "warmup_coeff")):
        with pytest.raises(CompressionError, match=message):
            make_compressor("dgc", 0.01, **kwargs)


# -- 1-bit Adam: DeepSpeed's compressed_allreduce, re-derived rank by rank -----------------------------------------
def ref_compressed_allreduce(buffers: list[torch.Tensor], worker_errors: list[torch.Tensor],
                             server_errors: list[torch.Tensor]) -> list[torch.Tensor]:
    """One call on every rank (lists indexed by rank) of a tensor of n elements, the errors sized as OnebitAdam sizes
    them; updates the errors in place and returns what each rank ends with."""
    size = len(buffers)
    n, corrected = buffers[0].numel(), worker_errors[0].numel()
    chunk = corrected // size
    sign_bits, scales = [], []
    for r in range(size):
        buf = torch.cat([buffers[r], torch.zeros(corrected - n)]) + worker_errors[r]
        scale = torch.linalg.norm(buf) / math.sqrt(buf.numel())
        plus = buf.sign().add(1).bool()
        worker_errors[r].copy_(buf - scale * plus.float().add(-0.5).mul(2.0))
        sign_bits.append(plus.view(size, chunk))  # row j goes to rank j (all_to_all_single)
        scales.append(scale)
    server_out, server_scales = [], []
    for j in range(size):  # rank j, server of chunk j
        got = torch.stack([sign_bits[i][j] for i in range(size)]).float().add(-0.5).mul(2.0)
        comp = (got * (torch.stack(scales) / size).view(-1, 1)).sum(0) + server_errors[j]
        s_scale = torch.linalg.norm(comp) / math.sqrt(comp.numel())
        plus = comp.sign().add(1).bool()
        server_errors[j].copy_(comp - s_scale * plus.float().add(-0.5).mul(2.0))
        server_out.append(plus)
        server_scales.append(s_scale)
    whole = torch.cat([server_out[j].float().add(-0.5).mul(2.0) * server_scales[j] for j in range(size)])
    return [whole[:n].clone() for _ in range(size)]


def corrected_size(n: int, size: int) -> int:
    divider = int(size * 8 / math.gcd(size, 8))
    return n + ((size * divider) - n % (size * divider)) % (size * divider)


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_onebit_matches_deepspeed_compressed_allreduce_value_for_value(workers):
    """Per tensor, as OnebitAdam calls it: three steps over `workers` in-process ranks, the outputs and every rank's
    worker and server errors."""
    shapes = [(12, 10), (7,), (33, 3)]
    layout = layout_of(shapes)
    d = sum(math.prod(s) for s in shapes)
    grads = steps(6, d, workers=workers)
    comp, comm = OneBit(seed=0), InProcessComm(workers)
    errors = [([torch.zeros(corrected_size(math.prod(s), workers)) for _ in range(workers)],
               [torch.zeros(corrected_size(math.prod(s), workers) // workers) for _ in range(workers)]) for s in shapes]
    for t, g in enumerate(grads):
        out = comp.compress(g, comm, t, layout)
        for (we, se), la in zip(errors, layout, strict=True):
            ref = ref_compressed_allreduce([g[r, la.offset:la.offset + la.numel] for r in range(workers)], we, se)
            torch.testing.assert_close(out.aggregate[0, la.offset:la.offset + la.numel], ref[0], rtol=1e-5, atol=1e-6)
    (lay, (worker_error, server_error)), = [(key[1], value) for key, value in comp._errors.items()]
    for i, (we, se) in enumerate(errors):
        for r in range(workers):
            start, chunk_start = lay.starts[i], lay.chunk_starts[i]
            torch.testing.assert_close(worker_error[r, start:start + lay.padded[i]], we[r], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(server_error[r, chunk_start:chunk_start + lay.chunks[i]], se[r], rtol=1e-5,
                                       atol=1e-6)
    # four collectives per bucket: 1 bit per (padded) element each way, one fp32 scale per tensor per message
    ops = [(r.op, r.tag, r.dtype, r.elements) for r in comm.log.records[:4]]
    padded = sum(corrected_size(math.prod(s), workers) for s in shapes)
    assert ops == [("alltoall", "signs", "uint8", padded // 8), ("allgather", "scales", "float32", 3),
                   ("allgather", "server-signs", "uint8", padded // 8 // workers),
                   ("allgather", "server-scales", "float32", 3)]


def test_onebit_error_compensation_conserves_the_sum_of_inputs():
    """Σ_t output_t + mean_i(worker error_i) + server error = Σ_t mean_i(x_t,i), on every real element: what the
    algebra of the two compensations says (both errors start at zero)."""
    d = 1000
    grads = steps(8, d, count=6)
    comp, comm = OneBit(seed=0, scope="bucket"), InProcessComm(P)
    total = torch.zeros(d)
    for t, g in enumerate(grads):
        total += comp.compress(g, comm, t).aggregate[0]
    (lay, (worker_error, server_error)), = [(key[1], value) for key, value in comp._errors.items()]
    server_whole = lay.from_servers(server_error.unsqueeze(0))[0]  # rank j's server error is chunk j of the whole
    owed = lay.unpad(worker_error.mean(0, keepdim=True) + server_whole.unsqueeze(0), d)[0]
    torch.testing.assert_close(total + owed, torch.stack(grads).mean(1).sum(0), rtol=1e-5, atol=1e-4)


def test_onebit_warm_up_is_a_dense_all_reduce_and_contributions_average_to_the_aggregate():
    grads = steps(9, 500, count=3)
    comp, comm = OneBit(warmup_steps=2), InProcessComm(P)
    outs = [comp.compress(g, comm, t) for t, g in enumerate(grads)]
    for t in (0, 1):
        torch.testing.assert_close(outs[t].aggregate[0], grads[t].mean(0))
    assert [r.op for r in comm.log.records] == ["allreduce", "allreduce", "alltoall", "allgather", "allgather",
                                                "allgather"]
    torch.testing.assert_close(outs[2].contribution.dense(500).mean(0), outs[2].aggregate[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(CompressionError, match="warmup_steps"):
        OneBit(warmup_steps=-1)


def test_sign_packing_round_trips_eight_to_a_byte():
    x = torch.randn(3, 64)
    packed = pack_signs(x >= 0)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 8)
    assert torch.equal(unpack_signs(packed), (x >= 0).float() * 2 - 1)
    assert int(pack_signs(torch.tensor([True] + [False] * 7))[0]) == 128  # the first element in the highest bit


# -- the all-to-all, its log and its price -------------------------------------------------------------------------
def test_all_to_all_in_process_solo_and_logged():
    comm = InProcessComm(3)
    t = torch.arange(18, dtype=torch.float32).view(3, 3, 2)
    out = comm.all_to_all(t, tag="x")
    for w in range(3):
        for j in range(3):
            assert torch.equal(out[w, j], t[j, w])  # worker w receives chunk w of every worker
    rec = comm.log.records[0]
    assert (rec.op, rec.elements, rec.bytes_per_rank, rec.total_bytes) == ("alltoall", 6, 24, 24)
    with pytest.raises(ValueError, match="chunks"):
        comm.all_to_all(torch.zeros(3, 2))
    solo = SoloComm(3, rank=1)
    assert torch.equal(solo.all_to_all(t[1:2], tag="x")[0], t[1, 1].expand(3, 2))


def test_all_to_all_is_priced_as_the_pairwise_exchange_and_server_chunks_follow_the_ranks():
    p, n = 8, 1e6
    topo = flat(p)
    a, b = topo.network.latency, 1 / topo.network.bandwidth_per_nic
    assert analytic.schedule_time(build("alltoall", "pairwise", n, topo), topo) == pytest.approx(
        (p - 1) * a + (p - 1) / p * n * b, rel=1e-12)
    # onebit measured on 4 workers, priced on 8 ranks: the server chunks halve, the rest is per rank already
    comm = InProcessComm(P)
    OneBit(scope="bucket").compress(torch.randn(P, 64_000), comm, 0)
    signs, _scales, server, _ = comm.log.records
    assert on_ranks(server, 8).bytes_per_rank == server.bytes_per_rank // 2 and on_ranks(signs, 8) == signs
    priced = price_records(comm.log.records, topo.with_overrides(library="ideal"))
    assert priced[2].bytes == server.bytes_per_rank * P  # the whole tensor's signs, whatever the ranks
    assert priced[0].bytes == signs.bytes_per_rank and priced[0].algo == "direct"  # ideal: the cheaper of the two


def test_both_keep_their_own_error_compensation():
    for name in ("dgc", "onebit"):
        assert INFO[name].own_memory and INFO[name].default_memory == "none"
        assert memory_for(name, "ef14") == "none"
    assert memory_for("topk", None) == "ef14" and memory_for("topk", "ef21") == "ef21"
    assert INFO["onebit"].family == "all-to-all" and INFO["dgc"].family == "all-gather"


def test_errors_are_measured_against_what_each_compensates():
    """Their `reference`: DGC's mean velocity before sending (= what is left + what was sent); 1-bit Adam's compensated
    input plus the server errors owed (= the output + what both errors now owe). None where one worker is here."""
    x = steps(11, 3000, count=2)
    comp, comm = DGC(0.02, seed=1), InProcessComm(P)
    for t, g in enumerate(x):
        out = comp.compress(g, comm, t)
        _, v, _ = comp.state(P, 3000, torch.device("cpu"))
        torch.testing.assert_close(out.reference, v.mean(0, keepdim=True) + out.aggregate, rtol=1e-5, atol=1e-6)
    one, comm = OneBit(scope="bucket"), InProcessComm(P)
    for t, g in enumerate(x):
        out = one.compress(g, comm, t)
    (lay, (worker_error, server_error)), = [(key[1], value) for key, value in one._errors.items()]
    owed = lay.unpad(worker_error.mean(0, keepdim=True) + lay.from_servers(server_error.unsqueeze(0)), 3000)
    torch.testing.assert_close(out.reference, out.aggregate + owed, rtol=1e-5, atol=1e-5)
    for compressor in (DGC(0.02), OneBit()):
        assert compressor.compress(x[0][:1], SoloComm(P), 0).reference is None


def test_direct_all_to_all_pays_the_latency_once_and_nccl_runs_it():
    p, n = 8, 1e6
    topo = flat(p)
    a, b = topo.network.latency, 1 / topo.network.bandwidth_per_nic
    assert analytic.schedule_time(build("alltoall", "direct", n, topo), topo) == pytest.approx(
        a + (p - 1) / p * n * b, rel=1e-12)
    assert plan(topo.with_overrides(library="nccl"), "alltoall", "auto", n).algo == "direct"
    assert plan(topo.with_overrides(library="gloo"), "alltoall", "auto", n).algo == "pairwise"
