"""The device level: NVML utilisation, memory, SM clock and power of the rank's GPU at step
boundaries (``samples/device``; ``codl.trace.device.DeviceSampler``)."""

from __future__ import annotations

from codl.harness.recorders.base import Recorder, RunContext
from codl.spec import DeviceKind
from codl.trace.device import DeviceSampler
from codl.trace.schema import Table
from codl.trace.store import TraceWriter


class DeviceRecorder(Recorder):
    """On for every run: where the level is off or NVML is missing, the trace says why
    (``device_level``)."""

    def __init__(self, ctx: RunContext) -> None:
        super().__init__(ctx)
        self.sampler = DeviceSampler(rank=ctx.rank, gpu_index=ctx.local_rank)
        if ctx.spec.device is DeviceKind.CUDA and ctx.spec.trace.device:
            self.sampler.start()

    def sample(self, step: int) -> None:
        self.sampler.sample(step)

    def stop(self, *, complete: bool) -> None:
        dev = self.sampler
        self.ctx.attrs["device_level"] = dev.unavailable_reason or (
            "on" if dev.rows["t_ns"] else "off"
        )

    def drain(self, writer: TraceWriter) -> None:
        if self.sampler.rows["t_ns"]:
            writer.append(Table.DEVICE, self.sampler.rows)

    def close(self) -> None:
        self.sampler.close()
