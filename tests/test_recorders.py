"""The trace levels' registry: which levels a run has, and the order their hooks run in."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from codl.harness.recorders import RECORDERS, Recorders
from codl.spec import RunSpec
from codl.trace.clock import take_anchor


def recorders(**trace: Any) -> Recorders:
    spec = RunSpec.from_dict({"mode": "compute"})
    # Past the spec's checks: the CUPTI levels need CUDA there, and exclude each other.
    spec = dataclasses.replace(spec, trace=dataclasses.replace(spec.trace, **trace))
    rec = Recorders.create(
        spec,
        rank=0,
        local_rank=0,
        placed=SimpleNamespace(rows=[]),
        kineto_dir=None,
        anchor_start=take_anchor(),
    )
    return rec


def names(rec: Recorders) -> list[str]:
    return [type(r).__name__ for r in rec.recorders]


def test_a_level_that_is_off_is_not_constructed() -> None:
    rec = recorders()
    try:
        assert names(rec) == [
            "AppRecorder",
            "SchedRecorder",
            "LoaderRecorder",
            "DeviceRecorder",
            "CommLevelRecorder",
            "PhaseSchedRecorder",
            "ThreadsRecorder",
        ]
    finally:
        rec.close()
    rec = recorders(sched=False, cpu=False)
    try:
        assert "SchedRecorder" not in names(rec)
        assert "PhaseSchedRecorder" not in names(rec)
        assert rec.ctx.spans.phase_sched is None
    finally:
        rec.close()


def test_start_and_stop_keep_the_order_the_tracers_have_always_had(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scheduler events start before the CUPTI levels and stop after Kineto, before the CUDA API
    tracer; every other hook runs in registry order."""
    calls: list[tuple[str, str]] = []
    for cls in RECORDERS:
        for hook in ("start", "stop", "close"):
            if hook in vars(cls):

                def log(self: Any, *a: Any, _hook: str = hook, **k: Any) -> None:
                    calls.append((_hook, type(self).__name__))

                monkeypatch.setattr(cls, hook, log)
    rec = recorders(cupti=True, cuda_api=True, sched_events=True)
    rec.start()
    rec.stop(complete=True)
    rec.close()

    def order(hook: str) -> list[str]:
        return [name for h, name in calls if h == hook]

    assert order("start") == ["SchedEventsRecorder", "KinetoRecorder", "CudaApiRecorder"]
    assert order("stop") == [
        "AppRecorder",
        "DeviceRecorder",
        "KinetoRecorder",
        "SchedEventsRecorder",
        "CudaApiRecorder",
    ]
    assert order("close") == ["SchedRecorder", "DeviceRecorder", "PhaseSchedRecorder"]
