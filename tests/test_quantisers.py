"""The quantisers (qsgd, terngrad, natural) and the sign family (signsgd, signum, efsignsgd) against references
written here in numpy from the papers and the GRACE suite's semantics, on the same tensors and the same draws:
what goes on the wire byte for byte, the decoded aggregate, unbiasedness over many draws, the packed sizes the
comm log prices, and the paths users run them through (compress, run, train, the DDP hook on two gloo ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import rank_reports

from arcsim.catalog import INFO
from arcsim.cli import cli
from arcsim.comm.inprocess import InProcessComm
from arcsim.compressors.memory import make_memory
from arcsim.compressors.quantisers import pack, unpack
from arcsim.compressors.registry import make_compressor
from arcsim.errors import CompressionError

HERE = Path(__file__).parent
CPU = torch.device("cpu")
QUANTISERS = ("qsgd", "terngrad", "natural")
SIGNS = ("signsgd", "signum", "efsignsgd")
P, D = 4, 3001  # an odd length: the last packed byte is partly padding


class Wire(InProcessComm):
    """An in-process communicator that keeps what was all-gathered: every worker's payload, as numpy bytes."""

    def all_gather(self, t: torch.Tensor, tag: str = "") -> torch.Tensor:
        self.sent = t.numpy().copy()
        return super().all_gather(t, tag)


def grads(seed: int = 0, workers: int = P, d: int = D) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(workers, d, generator=gen) * torch.rand(workers, 1, generator=gen).add(0.5)


def sent(name: str, x: torch.Tensor, step: int = 2, seed: int = 1, **options):
    comp, comm = make_compressor(name, seed=seed, **options), Wire(x.shape[0])
    return comp.compress(x, comm, step), comm.sent, comp


def header(row: np.ndarray, dtype=np.float32):
    return row[:4].view(dtype)[0]


def uniforms(comp, step: int, rank: int, d: int = D) -> np.ndarray:
    return comp.uniforms(step, rank, d, CPU).numpy()


def close(agg: torch.Tensor, ref: np.ndarray, rtol: float = 1e-5) -> None:
    np.testing.assert_allclose(agg[0].numpy(), ref, rtol=rtol, atol=rtol * float(np.abs(ref).max()))


# -- QSGD ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("levels", [127, 4, 300])
def test_qsgd_sends_what_a_numpy_qsgd_sends_on_the_same_draws(levels):
    """Alistarh et al.'s quantiser as GRACE runs it: r = |x|/‖x‖·s, level ⌊r⌋ + Bernoulli(r − ⌊r⌋), the sign,
    one int8 per element (int16 above 127 levels) and the norm; decoded sign·level·‖x‖/s and averaged."""
    x = grads(1)
    out, wire, comp = sent("qsgd", x, levels=levels)
    code = np.int8 if levels <= 127 else np.int16
    mean = np.zeros(D)
    for w in range(P):
        xw = x[w].numpy()
        norm = header(wire[w])
        assert norm == pytest.approx(np.linalg.norm(xw.astype(np.float64)), rel=1e-6)
        r = np.abs(xw) / norm * np.float32(levels)  # float32, in the reference's order
        level = np.minimum(np.floor(r) + (uniforms(comp, 2, w) < r - np.floor(r)), levels)
        expected = (np.sign(xw) * level).astype(code)
        np.testing.assert_array_equal(wire[w, 4:].view(code), expected)
        mean += expected * (np.float64(norm) / levels) / P
    close(out.aggregate, mean)


@pytest.mark.parametrize("block", [512, 1000])
def test_qsgd_in_blocks_is_the_papers_bucketed_quantiser_on_the_same_draws(block):
    """The paper's bucket size d (``block``): each d consecutive elements quantised against their own norm, sent
    as one fp32 per block before the codes (the last block short); a block as long as the bucket is the plain one."""
    x = grads(1)
    x[:, :1200] *= 1e-3  # a layer a thousand times smaller shares the bucket
    out, wire, comp = sent("qsgd", x, block=block)
    nb = -(-D // block)
    assert wire.shape[1] == 4 + 4 * nb + D
    mean = np.zeros(D)
    for w in range(P):
        xw = x[w].numpy()
        norms = wire[w, 4:4 + 4 * nb].view(np.float32)
        u = uniforms(comp, 2, w)
        decoded = np.zeros(D)
        for b in range(nb):
            part = slice(b * block, min(D, (b + 1) * block))
            assert norms[b] == pytest.approx(np.linalg.norm(xw[part].astype(np.float64)), rel=1e-5)
            r = np.abs(xw[part]) / norms[b] * np.float32(127)
            level = np.minimum(np.floor(r) + (u[part] < r - np.floor(r)), 127)
            np.testing.assert_array_equal(wire[w, 4 + 4 * nb:][part].view(np.int8), np.sign(xw[part]) * level)
            decoded[part] = np.sign(xw[part]) * level * (np.float64(norms[b]) / 127)
        mean += decoded / P
    close(out.aggregate, mean)
    small = slice(0, 1000)  # blocks wholly inside the small layer keep it; one norm over the bucket loses it
    whole = sent("qsgd", x)[0].aggregate[0, small]
    exact = x[:, small].mean(0)
    assert (out.aggregate[0, small] - exact).norm() < 0.1 * (whole - exact).norm()
    assert torch.equal(sent("qsgd", x, block=D)[0].aggregate, sent("qsgd", x)[0].aggregate)


# -- TernGrad ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("clip", [2.5, 0.0])
def test_terngrad_sends_what_a_numpy_terngrad_sends_on_the_same_draws(clip):
    """Wen et al.'s ternary gradient as their code and GRACE run it: clip to ±c·σ, s = max|g|, each element
    sign(g)·s with probability |g|/s else 0; two bits per element (0, +1, −1), four to a byte, and s."""
    x = grads(2)
    x[:, 7] = 40.0  # an outlier the clipping cuts
    out, wire, comp = sent("terngrad", x, clip=clip)
    mean = np.zeros(D)
    for w in range(P):
        xw = x[w].numpy()
        x64 = xw.astype(np.float64)
        bound = clip * np.sqrt(np.mean((x64 - x64.mean()) ** 2)) if clip else np.inf
        s = header(wire[w])
        assert s == pytest.approx(min(bound, np.abs(x64).max()), rel=1e-5)
        keep = uniforms(comp, 2, w) < np.minimum(np.abs(xw), s) / s
        expected = np.where(keep & (xw > 0), 1, np.where(keep & (xw < 0), 2, 0))
        codes = ((wire[w, 4:, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3).reshape(-1)
        np.testing.assert_array_equal(codes[:D], expected)
        assert not codes[D:].any()
        mean += np.float64(s) * ((expected == 1).astype(float) - (expected == 2)) / P
    close(out.aggregate, mean)


# -- natural compression -------------------------------------------------------------------------------------
def natural_reference(xw: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Horváth et al.'s C_nat: |x| in [2^e, 2^(e+1)) to 2^(e+1) with probability |x|/2^e − 1, else 2^e."""
    e = np.floor(np.log2(np.abs(xw).astype(np.float64), where=xw != 0, out=np.zeros(xw.shape)))
    p_up = np.abs(xw.astype(np.float64)) / 2.0 ** e - 1
    return np.where(xw == 0, 0.0, np.sign(xw) * 2.0 ** (e + (u < p_up)))


def test_natural_sends_what_a_numpy_natural_compression_sends_on_the_same_draws():
    """One byte per element: the sign and the exponent below the tensor's top exponent T (sent as int32),
    offsets 0…126, 127 for zero; the values are the reference's powers of two exactly."""
    x = grads(3)
    x[0, :5] = torch.tensor([0.0, 1.0, -0.5, 0.75, -3.0])  # a zero, exact powers (never rounded up), a midpoint
    out, wire, comp = sent("natural", x)
    mean = np.zeros(D)
    for w in range(P):
        xw = x[w].numpy()
        top = header(wire[w], np.int32)
        assert top == np.frexp(np.abs(xw).max())[1]  # ⌊log2 max|x|⌋ + 1
        codes = wire[w, 4:]
        offset, negative = codes & 0x7F, codes >> 7
        decoded = np.where(offset == 127, 0.0, (-1.0) ** negative * 2.0 ** (top - offset.astype(np.int64)))
        expected = natural_reference(xw, uniforms(comp, 2, w))
        np.testing.assert_array_equal(decoded, expected)
        if w == 0:  # whatever the draws: zero stays zero, a power of two stays itself, the rest go to a neighbour
            assert list(decoded[:3]) == [0.0, 1.0, -0.5]
            assert decoded[3] in (0.5, 1.0) and decoded[4] in (-2.0, -4.0)
        mean += expected / P
    close(out.aggregate, mean, rtol=1e-6)


def test_natural_rounds_magnitudes_below_its_range_to_zero_or_its_smallest_power_without_bias():
    """2^126 below the top exponent the code has no power left: those round to 2^(T−126) or 0, still unbiased."""
    d = 4000
    x = torch.full((2, d), 2.0 ** -27)
    x[:, 0] = 2.0 ** 100  # T = 101: the smallest power it codes is 2^-25, so 2^-27 goes up with probability 1/4
    out, wire, _ = sent("natural", x)
    assert header(wire[0], np.int32) == 101
    small = out.aggregate[0, 1:].double()
    assert set(small.unique().tolist()) <= {0.0, 2.0 ** -25 / 2, 2.0 ** -25}
    assert float(small.mean()) == pytest.approx(2.0 ** -27, rel=0.1)


# -- the sign family -----------------------------------------------------------------------------------------
def sign_payload(xw: np.ndarray) -> tuple[float, np.ndarray]:
    """One bit per element, x ≥ 0 → 1, the first element in the lowest bit; the scale ‖x‖₁/d."""
    return float(np.abs(xw.astype(np.float64)).mean()), np.packbits(xw >= 0, bitorder="little")


def check_signs_on_the_wire(wire: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The bits and scales every worker sent against sign_payload of what it had to send; the scales."""
    scales = []
    for w in range(len(targets)):
        scale, bits = sign_payload(targets[w])
        assert header(wire[w]) == pytest.approx(scale, rel=1e-6)
        np.testing.assert_array_equal(wire[w, 4:], bits)
        scales.append(scale)
    return np.array(scales)


def vote(targets: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Bernstein et al.'s majority vote (a tie abstains), times the mean of the workers' scales."""
    return np.sign(np.where(targets >= 0, 1, -1).sum(axis=0)) * scales.mean()


def test_signsgd_is_the_majority_vote_of_one_bit_signs():
    x = grads(4, workers=5)  # an odd count: no ties
    x[:, 0] = 0.0  # sign(0) is sent as + (one bit has no zero)
    x[:2, 1], x[2:, 1] = 1.0, -1.0  # three against two: −
    out, wire, _ = sent("signsgd", x)
    targets = x.numpy()
    scales = check_signs_on_the_wire(wire, targets)
    close(out.aggregate, vote(targets, scales))
    assert out.aggregate[0, 0] > 0 and out.aggregate[0, 1] < 0
    even = grads(4)  # four workers: a 2–2 tie abstains
    even[:2, 3], even[2:, 3] = 1.0, -1.0
    tied, _, _ = sent("signsgd", even)
    assert tied.aggregate[0, 3] == 0


def test_signum_votes_on_each_workers_momentum_kept_across_steps():
    comp, comm, beta = make_compressor("signum", seed=1, beta=0.8), Wire(P), 0.8
    momentum = None
    for step in range(3):
        x = grads(10 + step)
        out = comp.compress(x, comm, step)
        xs = x.numpy().astype(np.float64)
        momentum = xs.copy() if momentum is None else beta * momentum + (1 - beta) * xs  # first step m = x (GRACE)
        scales = check_signs_on_the_wire(comm.sent, momentum.astype(np.float32))
        close(out.aggregate, vote(momentum, scales))


def test_efsignsgd_with_its_error_feedback_is_karimireddys_loop():
    """p = g + e; Δ = ‖p‖₁/d·sign(p); e ← p − Δ; the update is the mean of the workers' Δ (no vote)."""
    assert INFO["efsignsgd"].default_memory == "ef14"
    comp, mem, comm = make_compressor("efsignsgd", seed=1), make_memory("ef14"), Wire(P)
    error = np.zeros((P, D))
    for step in range(4):
        g = grads(20 + step)
        update = mem.step(g, comp, comm, step)
        p = g.numpy().astype(np.float64) + error
        scales = check_signs_on_the_wire(comm.sent, p.astype(np.float32))
        delta = scales[:, None] * np.where(p >= 0, 1.0, -1.0)
        error = p - delta
        close(update, delta.mean(axis=0))
        torch.testing.assert_close(mem.residual().double(), torch.from_numpy(error), rtol=1e-5, atol=1e-5)


# -- unbiasedness over many draws ----------------------------------------------------------------------------
def variance(name: str, x: np.ndarray, **options) -> np.ndarray:
    """Per element, the variance of one draw of each quantiser (from its two possible values)."""
    a = np.abs(x.astype(np.float64))
    if name == "qsgd":
        s, norm = options.get("levels", 127), np.linalg.norm(a)
        f = a / norm * s - np.floor(a / norm * s)
        return (norm / s) ** 2 * f * (1 - f)
    if name == "terngrad":
        return a * a.max() - a ** 2
    low = 2.0 ** np.floor(np.log2(a))
    return (2 * low - a) * (a - low)


@pytest.mark.parametrize(("name", "options"), [("qsgd", {}), ("qsgd", {"levels": 2}), ("terngrad", {"clip": 0.0}),
                                               ("natural", {})])
def test_unbiased_over_many_draws(name, options):
    """64 workers holding the same row draw independently; over 40 steps the mean of 2560 draws is the row,
    within 5 standard errors per element (the variance each quantiser's two values give)."""
    workers, steps, d = 64, 40, 120
    row = grads(30, workers=1, d=d)
    x = row.repeat(workers, 1)
    comp, comm = make_compressor(name, seed=5, **options), InProcessComm(workers)
    acc = torch.zeros(d, dtype=torch.float64)
    for step in range(steps):
        acc += comp.compress(x, comm, step).aggregate[0].double() / steps
    n = workers * steps
    se = np.sqrt(variance(name, row[0].numpy(), **options) / n)
    err = np.abs(acc.numpy() - row[0].numpy().astype(np.float64))
    assert (err <= 5 * se + 1e-6 * float(row.abs().max())).all(), (name, float((err / (se + 1e-12)).max()))
    assert (se > 0).sum() > d // 2  # the draws do vary: the check has something to check


def test_the_unbiasedness_check_catches_a_biased_quantiser():
    """TernGrad clipped at 2.5σ is biased on an outlier (by design): the same statistic sees it."""
    workers, steps, d = 64, 20, 120
    row = grads(31, workers=1, d=d)
    row[0, 3] = 12.0
    comp, comm = make_compressor("terngrad", seed=5), InProcessComm(workers)
    acc = sum(comp.compress(row.repeat(workers, 1), comm, s).aggregate[0] for s in range(steps)) / steps
    assert float(acc[3]) < 0.5 * 12.0


# -- bytes on the wire ---------------------------------------------------------------------------------------
BITS = {"qsgd": 8, "terngrad": 2, "natural": 8, "signsgd": 1, "signum": 1, "efsignsgd": 1}


@pytest.mark.parametrize("d", [1, 7, 8, 9, 1000])
@pytest.mark.parametrize("name", [*QUANTISERS, *SIGNS])
def test_one_packed_all_gather_of_the_true_bit_count_and_a_4_byte_header(name, d):
    comm = InProcessComm(3)
    make_compressor(name).compress(torch.randn(3, d), comm, 0)
    (r,) = comm.log.records
    assert (r.op, r.tag, r.dtype) == ("allgather", "values+scale", "uint8")
    assert r.bytes_per_rank == 4 + -(-d * BITS[name] // 8) and r.total_bytes == 3 * r.bytes_per_rank
    wide = InProcessComm(3)
    make_compressor("qsgd", levels=128).compress(torch.randn(3, d), wide, 0)
    assert wide.log.records[0].bytes_per_rank == 4 + 2 * d  # int16 levels above 127


@pytest.mark.parametrize("bits", [1, 2, 8])
def test_pack_puts_the_first_code_in_the_lowest_bits_and_unpacks_back(bits):
    gen = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2 ** bits if bits < 8 else 256, (37,), generator=gen, dtype=torch.uint8)
    packed = pack(codes, bits)
    assert packed.numel() == -(-37 * bits // 8)
    assert torch.equal(unpack(packed, bits, 37), codes)
    if bits == 1:
        np.testing.assert_array_equal(packed.numpy(), np.packbits(codes.numpy().astype(bool), bitorder="little"))


# -- descriptors and refusals --------------------------------------------------------------------------------
def test_catalog_marks_them_density_free_all_gathered_with_their_papers_memory():
    for name in (*QUANTISERS, *SIGNS):
        info = INFO[name]
        assert info.density_free and info.family == "all-gather"
        assert info.default_memory == ("ef14" if name == "efsignsgd" else "none")
    x = grads(6)
    for density in (0.01, 0.5):  # the density is accepted and changes nothing
        assert torch.equal(sent("qsgd", x)[0].aggregate,
                           make_compressor("qsgd", density, seed=1).compress(x, InProcessComm(P), 2).aggregate)


@pytest.mark.parametrize(("name", "options", "message"), [
    ("qsgd", {"levels": 0}, "levels s must be"),
    ("qsgd", {"levels": 2.5}, "levels s must be"),
    ("qsgd", {"levels": 40000}, "levels s must be"),
    ("qsgd", {"block": -1}, "block must be"),
    ("qsgd", {"block": 2.5}, "block must be"),
    ("terngrad", {"clip": -1.0}, "clip c must be"),
    ("signum", {"beta": 1.0}, "momentum β must be"),
    ("signsgd", {"beta": 0.9}, "signsgd takes no option beta"),
])
def test_bad_options(name, options, message):
    with pytest.raises(CompressionError, match=message):
        make_compressor(name, **options)


def test_draws_differ_per_worker_step_and_seed_and_repeat_with_them():
    comp = make_compressor("qsgd", seed=1)
    a = comp.uniforms(3, 0, 50, CPU)
    assert torch.equal(a, make_compressor("qsgd", seed=1).uniforms(3, 0, 50, CPU))
    for other in (comp.uniforms(3, 1, 50, CPU), comp.uniforms(4, 0, 50, CPU),
                  make_compressor("qsgd", seed=2).uniforms(3, 0, 50, CPU)):
        assert not torch.equal(a, other)


# -- the paths users run them through ------------------------------------------------------------------------
def test_arcsim_compress_runs_them_with_their_default_memory_and_logs_the_packed_bytes():
    for name, memory, nbytes in (("qsgd", "none", 4 + 3000), ("efsignsgd", "ef14", 4 + 375)):
        result = CliRunner().invoke(cli, ["compress", "-c", name, "--synthetic", "normal", "-w", "4", "-n", "3000",
                                          "-s", "2", "--json", "-"])
        assert result.exit_code == 0, result.output
        out = json.loads(result.output)
        assert out["memory"] == memory
        for step in out["steps"]:
            assert step["collectives"] == [{"op": "allgather", "tag": "values+scale", "elements": nbytes,
                                            "dtype": "uint8", "bytes_per_rank": nbytes}]
            assert step["density_achieved"] == 1.0 and 0 < step["rel_error"] < 1


def test_arcsim_run_prices_each_once_as_an_all_gather_of_its_packed_bytes():
    result = CliRunner().invoke(cli, ["run", "-c", ",".join((*QUANTISERS, *SIGNS)), "--gpu", "cpu", "--policy", "none",
                                      "--json", "-", "-q"])
    assert result.exit_code == 0, result.output
    res = json.loads(result.output)
    cands, dense = res["candidates"], res["dense"]["bytes_per_rank"]
    for name in (*QUANTISERS, *SIGNS):
        mine = [c for c in cands if c["compressor"] == name]
        assert mine and all(c["op"] == "allgather" and c["density"] is None for c in mine)
        # 32 bits of fp32 against its bits per element, a 4-byte header per bucket aside
        assert mine[0]["bytes_per_rank"] / dense == pytest.approx(BITS[name] / 32, rel=0.02)


def test_arcsim_train_trains_through_them():
    from arcsim.train.loop import TrainConfig, prepare, train

    cfg = TrainConfig(model="mlp", dataset="digits", workers=4, batch=8, steps=6, eval_every=3, memory="none")
    setup = prepare(cfg)
    for name in (*QUANTISERS, *SIGNS):
        hist = train(cfg, setup, name, seed=0)
        assert hist.diverged_at is None and all(np.isfinite(hist.loss)), name
        assert all(r.op == "allgather" and r.dtype == "uint8" for step in hist.measurement.records
                   for bucket in step for r in bucket), name


def test_as_ddp_hooks_on_two_gloo_ranks_they_equal_the_in_process_simulation(tmp_path):
    reports = rank_reports(HERE / "_quantisers_ddp.py", 2, tmp_path)
    for report in reports:
        for name, got in report.items():
            assert got["rel_diff"] <= 1e-6, (name, got["rel_diff"])
            assert got["steps"] == 3
            bits = BITS[name]
            per_step = len(got["sizes"]) // 3
            expected = [4 + -(-n * bits // 8) for n in got["sizes"][:per_step]]
            assert [r[3] for r in got["records"][:per_step]] == expected, name
            assert all(r[:3] == ["allgather", "values+scale", "uint8"] and r[4] == 2 * r[3] for r in got["records"])
