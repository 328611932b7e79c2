"""One answer to "how long does a step of model M take on GPU G": the measured profile when one was shipped
for exactly (M, G, batch, precision), else the fitted roofline model, with the error to expect."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from arcsim.devices.catalog import Device, device, modelled_device
from arcsim.devices.compute import find_measured, load_fit, modelled_profile
from arcsim.errors import ArcsimError
from arcsim.files import writable_cache_dir
from arcsim.models.inputs import RecordedInput
from arcsim.models.source import ModelSource, as_source
from arcsim.models.workload import count_workload
from arcsim.traces.profile import ComputeProfile, load_profile

DEFAULT_GPU_BATCH = 32  # per GPU, when a run on a GPU names none (--batch)


@dataclass(frozen=True)
class ComputePrediction:
    profile: ComputeProfile
    device: Device
    precision: str
    source: str                    # "measured" or "modelled"
    detail: str                    # the measured file, or how the model was fitted
    expected_error: float | None   # mean |relative error| of forward + backward to expect (modelled only)

    def to_dict(self) -> dict:
        p = self.profile
        return {"model": p.model, "gpu": self.device.name, "batch": p.batch, "precision": self.precision,
                "source": self.source, "detail": self.detail, "expected_error": self.expected_error,
                "params": sum(x.numel for x in p.layers), "forward_s": p.forward_s, "backward_s": p.backward_s,
                "layers": [{"name": x.name, "numel": x.numel, "ready_s": x.ready_s} for x in p.layers]}


def check_request(model: str | ModelSource, gpu: str, batch: int, precision: str) -> Device:
    """The device, after checking the request: one error line for each kind of mistake."""
    writable_cache_dir()  # the model's workload is kept there
    dev = modelled_device(gpu, precision, batch)
    as_source(model).check()
    return dev


def expected_error(model: str, dev: Device) -> tuple[float, str]:
    """What the fit's held-out tests say to expect for this model on this device."""
    _, data = load_fit()
    fitted_models = {k.split("-b")[0] for k in data.get("leave_one_out", {})}
    if model in fitted_models:
        errors = [abs(v) for k, v in data["leave_one_out"].items() if k.split("-b")[0] == model]
        what = f"leave-one-out on the {data['device']} profiles of {model}"
    else:
        errors = [abs(v) for v in data.get("leave_one_model_out", {}).values()]
        what = f"leave-one-model-out on the {data['device']} profiles (a model the fit never saw)"
    error = statistics.fmean(errors) if errors else float("nan")
    if dev.name != data["device"]:
        transfer = data.get("summary", {}).get(f"transfer_{dev.name}") or data.get("summary", {}).get("transfer_h200")
        if transfer:
            error = max(error, transfer["mean_abs"])
            what += f"; on another GPU, as the {data['device']} fit predicts the measured H200 profiles"
    return error, what


def predict_compute(model: str | ModelSource, gpu: str, batch: int, precision: str = "fp32", modelled: bool = False,
                    dataset: str | None = None, data: str | RecordedInput | None = None,
                    input_size: int | None = None) -> ComputePrediction:
    """``model``: a zoo name or any model source; ``dataset`` (default: the model's own) sets the input shape,
    and a measured profile must share it; ``data``: the user's batches, or a recorded job's input, instead."""
    source = as_source(model)
    dev = check_request(source, gpu, batch, precision)
    dataset = source.dataset_for(dataset, data, input_size)  # None: the user's batches feed it
    measured = (None if modelled or source.entry is None or input_size is not None else
                find_measured(source.ref, dev.name, batch, precision))
    if measured is not None and measured.dataset not in (None, dataset):
        measured = None
    if measured is not None:
        return ComputePrediction(load_profile(measured.path), dev, precision, "measured",
                                 f"shipped profile {measured.path.name}", None)
    eff, fit = load_fit()
    profile = modelled_profile(count_workload(source, batch, dataset, input_size, data), dev, precision, eff)
    error, what = expected_error(source.ref if source.entry else "", dev)
    return ComputePrediction(profile, dev, precision, "modelled",
                             f"roofline fitted on {len(fit['fitted_on'])} {fit['device']} profiles; expected "
                             f"error ±{error:.0%} ({what})", error)


def device_of_profile(profile: ComputeProfile, where: str) -> Device | None:
    """The catalogue GPU a compute profile was measured on (by its device name), None for a CPU profile."""
    from arcsim.devices.catalog import devices

    if profile.device == "cpu":
        return None
    found = profile.device_name.lower()
    name = next((d for d in devices() if d != "cpu" and d in found), None)
    if name is None:
        raise ArcsimError(f"compute profile {where} was taken on {profile.device_name}, not a catalogue GPU: say "
                          "which GPU to price compression on (--gpu, or the topology's gpu:)")
    return device(name)
