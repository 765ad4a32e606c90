"""Device level: NVML utilisation, memory and SM clock, sampled at step boundaries.

Without an NVIDIA driver (CPU runs, CI) the sampler reports itself unavailable and records
nothing; the reason is kept for the trace's provenance instead of failing the run.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from codl.trace.clock import now_ns
from codl.trace.schema import Table, empty_columns


@dataclass
class DeviceSampler:
    rank: int = 0
    gpu_index: int = 0
    unavailable_reason: str = ""
    _handle: Any = None
    _nvml: Any = None
    rows: dict[str, list[Any]] = field(default_factory=lambda: empty_columns(Table.DEVICE))

    def start(self) -> bool:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.gpu_index)
            self._nvml = pynvml
        except Exception as exc:
            self.unavailable_reason = f"NVML unavailable: {exc}"
            self._handle = None
            return False
        return True

    def sample(self, step: int) -> None:
        if self._handle is None:
            return
        nv = self._nvml
        try:
            util = nv.nvmlDeviceGetUtilizationRates(self._handle)
            mem = nv.nvmlDeviceGetMemoryInfo(self._handle)
            clock = nv.nvmlDeviceGetClockInfo(self._handle, nv.NVML_CLOCK_SM)
            power = nv.nvmlDeviceGetPowerUsage(self._handle)
        except nv.NVMLError as exc:
            self.unavailable_reason = f"NVML sampling stopped: {exc}"
            self._handle = None
            return
        r = self.rows
        r["t_ns"].append(now_ns())
        r["rank"].append(self.rank)
        r["step"].append(step)
        r["gpu"].append(self.gpu_index)
        r["util_pct"].append(int(util.gpu))
        r["mem_util_pct"].append(int(util.memory))
        r["mem_used"].append(int(mem.used))
        r["sm_clock"].append(int(clock))
        r["power"].append(int(power))

    def close(self) -> None:
        if self._nvml is not None:
            # Shutting down a library we only read from: nothing to recover.
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None
            self._handle = None
