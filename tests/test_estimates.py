"""Heavy work says what it will take before it starts, and training past this machine's memory is refused."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import interruptible, run_cli

from arcsim.traces import estimates
from arcsim.traces.training import TrainingConfig


def test_training_memory_grows_by_one_gradient_per_worker_and_time_with_the_steps():
    two, four = (estimates.training(TrainingConfig(model="cnn", workers=w, steps=1)) for w in (2, 4))
    params = 38_282  # the cnn's
    assert four.memory_bytes - two.memory_bytes == pytest.approx(2 * 4 * params)  # each worker's recorded gradient
    longer = estimates.training(TrainingConfig(model="cnn", workers=2, steps=3))
    assert longer.seconds - estimates.TRAIN_START_S == pytest.approx(3 * (two.seconds - estimates.TRAIN_START_S))
    sgd, adamw = (estimates.training(TrainingConfig(model="cnn", workers=2, steps=2, optimizer=o)) for o in
                  ("sgd", "adamw"))
    assert adamw.memory_bytes - sgd.memory_bytes == pytest.approx(4 * params)  # AdamW's second moment
    assert sgd.memory_bytes - two.memory_bytes == pytest.approx(2 * 4 * params)  # the average and the momentum: only
    #                                                              where a step follows the last recorded one
    assert "38,282 parameters × 2 workers" in two.describe()


def test_past_the_available_memory_is_refused_unless_forced(monkeypatch):
    est = estimates.Estimate(10e9, 60.0, "a test")
    monkeypatch.setattr(estimates, "available_memory", lambda: 5e9)
    with pytest.raises(estimates.TooBig, match=r"needs about 10 GB .* 5 GB available; .* --force"):
        estimates.check_fits("capturing x", est, force=False)
    estimates.check_fits("capturing x", est, force=True)
    monkeypatch.setattr(estimates, "available_memory", lambda: 20e9)
    estimates.check_fits("capturing x", est, force=False)


@pytest.mark.parametrize("args", [
    ("trace", "capture", "--model", "llama_1b", "-w", "1024", "-o", "{out}"),
    ("run", "--live", "--model", "llama_1b", "-w", "1024"),
])
def test_a_training_past_the_machine_is_one_error_line_and_writes_nothing(tmp_path, args):
    out = tmp_path / "big.npz"
    r = run_cli(*(a.format(out=out) for a in args))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "1,339,082,752 parameters × 1024 workers" in lines[0]
    assert "available" in lines[0] and "--force" in lines[0] and not out.exists()


def test_a_capture_says_its_estimate_first_when_it_is_worth_saying(tmp_path):
    """The estimate comes before any work: read it, interrupt, and nothing is left half-written."""
    out = tmp_path / "c.npz"
    proc = subprocess.Popen([sys.executable, "-m", "arcsim", "trace", "capture", "--model", "llama_60m", "-w", "4",
                             "-s", "1", "-b", "1", "-o", str(out)], stderr=subprocess.PIPE, text=True,
                            preexec_fn=interruptible)
    first = proc.stderr.readline()  # over NOTE_BYTES: weights, gradients and 4 workers' recorded ones
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert first.startswith("capture llama_60m: about ") and "of memory and ~" in first and "4 workers" in first
    assert proc.returncode == 130 and "interrupted" in err, err
    assert list(tmp_path.iterdir()) == []
    r = run_cli("trace", "capture", "--model", "cnn", "-w", "2", "-s", "1", "-o", str(tmp_path / "small.npz"))
    assert r.returncode == 0 and "capture cnn: about" not in r.stderr  # a second's work goes unannounced


def test_a_cold_run_counts_what_it_must_measure_and_a_warm_one_nothing():
    from arcsim.run.analysis import Analysis
    from arcsim.run.config import RunConfig

    cfg = RunConfig(compressors=("dense", "topk"), ratios=(0.01, 0.1), seed=123)  # a seed no other test caches
    cold = Analysis(cfg)
    quiet = estimates.Load(0.0, 2)
    todo, seconds = cold.measuring_work(quiet)
    assert todo == cold.planned_measurements() == 3 <= cfg.planned_measurements_at_most()
    read = sum(cold.trace.workers * k[2] * cold.trace.elements for k in cold.planned_keys())
    stored = cold.trace.steps * cold.trace.workers * cold.trace.elements * cold.trace.dtype.itemsize
    assert seconds == pytest.approx(estimates.MeasuringWork(one_thread=read, measurements=3, trace_bytes=stored,
                                                            timed=cold.ctx.gpu is None).seconds(quiet))
    # (too few to fork for, each on one thread: the cnn's buckets are small; the trace read once, then kept)
    told: list[str] = []
    cold.detail = told.append  # the bar's note moves within a measurement, step by step
    cold.run()
    steps = cold.trace.steps
    assert [f"dense @ 1, step {i}/{steps}" for i in range(1, steps + 1)] == [t for t in told if t.startswith("dense")]
    assert Analysis(cfg).measuring_work() == (0, 0.0)  # all in the cache now


def test_measuring_estimates_rise_with_the_load_other_work_puts_on_the_cores():
    """A busy machine had made the estimate 3-4x low (~40 s said, 163 s taken)."""
    threaded = estimates.MeasuringWork(threaded=4e9)
    idle, busy, busier = (threaded.seconds(estimates.Load(load, 2)) for load in (0.0, 4.0, 6.0))
    assert idle == pytest.approx(4e9 / estimates.MEASURE_ELEMENTS_PER_S)
    assert busy == pytest.approx(3 * idle) and busier == pytest.approx(4 * idle)
    assert estimates.Load(0.2, 2).describe() == ""  # a quiet machine is not mentioned
    assert "the cores busy: load 4.0 on 2, 3.0× an idle machine's time" in estimates.Load(4.0, 2).describe()
    # one thread beside one other task on two cores has a core of its own; beside three, a fair half
    assert estimates.Load(1.0, 2).cores_for(1) == 1.0 and estimates.Load(3.0, 2).cores_for(1) == 0.5
    # side by side in two single-threaded processes: half the time on two free cores; beside two others' tasks a
    # fair share is one core between them, an idle machine's time for one
    pair = estimates.MeasuringWork(side_by_side=4e9, processes=2)
    one = 4e9 / estimates.MEASURE_ONE_THREAD_ELEMENTS_PER_S  # one process's time for them all
    halved, shared = (pair.seconds(estimates.Load(load, 2)) for load in (0.0, 2.0))
    assert halved == pytest.approx(one / 2) and shared == pytest.approx(one)
    # reading the stored trace goes on one thread: at its rate on a free core, at half of it beside three others
    read = estimates.MeasuringWork(trace_bytes=2e9)
    assert read.seconds(estimates.Load(1.0, 2)) == pytest.approx(2e9 / estimates.TRACE_READ_BYTES_PER_S)
    assert read.seconds(estimates.Load(3.0, 2)) == pytest.approx(2 * 2e9 / estimates.TRACE_READ_BYTES_PER_S)


@pytest.mark.skipif(not Path("/proc/loadavg").exists(), reason="the runnable tasks are read from /proc/loadavg")
def test_the_load_is_the_tasks_runnable_now():
    """Two processes spinning: Load.now sees them at once (the 1-minute load average takes a minute, and kept a
    finished run's load for as long)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.3)
        assert estimates.Load.now().others >= 1.5
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def test_a_capture_on_demand_says_its_estimate_and_is_refused_past_the_memory(monkeypatch, tmp_path):
    from arcsim.traces.resolve import resolve_trace

    monkeypatch.setenv("ARCSIM_TRACE_DIR", str(tmp_path))
    monkeypatch.setattr(estimates, "available_memory", lambda: 1.0)
    refused = r"capturing resnet18\.npz needs about .* --force to try anyway \(or .*arcsim trace capture .* --force\)"
    with pytest.raises(estimates.TooBig, match=refused):
        resolve_trace("resnet18.npz", announce=lambda _: None)
    assert not any(tmp_path.iterdir())  # refused before any training


@pytest.mark.parametrize(("streamed", "processes", "apart"), [(False, 1, False), (True, 1, False), (True, 2, False),
                                                           (True, 1, True)],
                         ids=["kept", "streamed", "streamed, the sample gathered first", "streamed, a pass a run"])
def test_the_measuring_estimate_counts_the_trace_bytes_a_run_reads(tmp_path, monkeypatch, streamed, processes, apart):
    """Every gradient byte a run reads from the file (where the trace reads them, in this process: the side-by-side
    processes read what it gathered), as the estimate counts it. A kept trace is loaded once. A streamed one is read
    whole to gather the layer sample (Top-K's and the others'), first where runs go side by side, else in the run's
    order; PowerSGD's pass reads its buckets. With a bucket sample and no room for two runs' state in a pass, each
    run is a pass of its own, and the first reads the steps whole to check them finite, before the gathering."""
    from arcsim.processes import usable_cores
    from arcsim.run import analysis
    from arcsim.run.analysis import Analysis
    from arcsim.run.config import RunConfig
    from arcsim.traces.format import Trace

    if processes > usable_cores():
        pytest.skip(f"runs side by side need {processes} usable cores")
    monkeypatch.setenv("ARCSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ARCSIM_SAMPLE_ELEMENTS", "2e6")  # the shipped trace measured on a layer sample
    monkeypatch.setenv("ARCSIM_MEASURE_PROCESSES", str(processes))
    if streamed:
        monkeypatch.setattr(analysis, "CACHE_BYTES", 1)
    if apart:
        monkeypatch.setattr(analysis, "MIN_SAMPLE_SAVING", -1.0)  # a bucket sample, however little it leaves out
        monkeypatch.setattr(analysis, "LIVE_MEMORY_BYTES", 1)     # room for one run's state in a pass
    config = RunConfig(compressors=("powersgd", "topk", "randk", "terngrad"), ratios=(0.01, 0.1))
    if apart:  # dense in the cache: PowerSGD's pass, first, reads the steps whole to check them, then the gathering
        Analysis(config, announce=lambda _: None).measurement("dense", 1.0)
    read: list[int] = []
    real = Trace._read_into
    monkeypatch.setattr(Trace, "_read_into",
                        lambda self, fh, out: read.append(out.numel() * out.element_size()) or real(self, fh, out))
    a = Analysis(config, announce=lambda _: None)
    todo = a._to_measure()
    ahead = a._parallel_todo(None, todo)
    assert a.streamed() == streamed and a.layer_sample() is not None and bool(ahead) == (processes > 1)
    assert apart == any(a.sample_for(k) is not None for k in todo)
    said = a._trace_bytes_read(todo, bool(ahead))
    read.clear()
    a.run()
    stored = a.trace.steps * a.trace.step_bytes()
    assert sum(read) == said >= stored
