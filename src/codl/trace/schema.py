"""HDF5 trace schema, version 1: the tables, their columns, dtypes and units.

One table is a group of parallel 1-D datasets (struct of arrays), one dataset per column, all of
the same length. Columns of kind ``sym`` hold int32 indices into the interned string table
``/strings`` (index 0 is the empty string). Every time column is CLOCK_MONOTONIC nanoseconds of
the node (``unit = "ns"``); durations are ``ns`` too. ``docs/trace-format.md`` is the prose form
of this module; keep both in step and bump ``SCHEMA_VERSION`` on any incompatible change.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 1


class Phase(enum.StrEnum):
    """The application spans of ``events/app`` (its ``phase`` column), in the order the docs
    list them. The harness writes them and the analysis reads them: one spelling for both."""

    STEP = "step"
    DATA_WAIT = "data_wait"
    H2D = "h2d"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    COMPUTE = "compute"
    ALLREDUCE = "allreduce"
    SLEEP = "sleep"


class LoaderStage(enum.StrEnum):
    """The stages of ``events/loader`` (its ``stage`` column): per item, then per batch."""

    FETCH = "fetch"
    DECODE = "decode"
    TRANSFORM = "transform"
    COLLATE = "collate"


# Phases whose launch-role counters are read at their boundaries (events/phase_sched).
SAMPLED_PHASES: tuple[str, ...] = tuple(
    p.value for p in (Phase.COMPUTE, Phase.DATA_WAIT, Phase.ALLREDUCE)
)
# Stages timed per data-set item (rows with item >= 0); collate is timed per batch.
LOADER_ITEM_STAGES: tuple[str, ...] = tuple(
    s.value for s in (LoaderStage.FETCH, LoaderStage.DECODE, LoaderStage.TRANSFORM)
)


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # numpy dtype string; "sym" means an int32 index into /strings
    unit: str = ""
    doc: str = ""

    @property
    def is_symbol(self) -> bool:
        return self.dtype == "sym"

    @property
    def numpy_dtype(self) -> str:
        return "i4" if self.is_symbol else self.dtype


def _c(name: str, dtype: str, unit: str = "", doc: str = "") -> Column:
    return Column(name, dtype, unit, doc)


TABLES: dict[str, tuple[Column, ...]] = {
    # Application spans, one row per phase per step per rank.
    "events/app": (
        _c("rank", "i2", doc="global rank"),
        _c("step", "i4", doc="step index; steps < warmup_steps are warm-up"),
        _c(
            "phase",
            "sym",
            doc=", ".join(p.value for p in Phase),
        ),
        _c("tid", "i8", doc="native thread id that ran the span"),
        _c("start_ns", "i8", "ns"),
        _c("end_ns", "i8", "ns"),
        _c("gpu_ns", "i8", "ns", "GPU duration from CUDA events; -1 when not measured"),
    ),
    # Loader work inside worker processes: per item (fetch, decode, transform) and per batch
    # (collate, item = -1). `step` is the consuming step, assigned when the batch arrives.
    "events/loader": (
        _c("rank", "i2"),
        _c("step", "i4"),
        _c("worker", "i2", doc="DataLoader worker id"),
        _c("pid", "i8"),
        _c("tid", "i8"),
        _c("cpu", "i2", doc="CPU the worker ran on at the end of the stage (sched_getcpu)"),
        _c("item", "i8", doc="data set index; -1 for batch-level stages"),
        _c("stage", "sym", doc=", ".join(s.value for s in LoaderStage)),
        _c("start_ns", "i8", "ns"),
        _c("end_ns", "i8", "ns"),
    ),
    # CUDA runtime API calls (from the `cuda_api` callbacks or Kineto) and GPU activities (Kineto
    # only); both levels are explicit and exclude each other.
    "events/cuda": (
        _c("rank", "i2"),
        _c("step", "i4", doc="-1 when outside every step span"),
        _c("kind", "sym", doc="runtime, kernel, memcpy, memset, sync"),
        _c("name", "sym"),
        _c("tid", "i8", doc="host thread for runtime calls; 0 for GPU activities"),
        _c("stream", "i8", doc="CUDA stream for GPU activities; -1 for runtime calls"),
        _c("correlation", "i8"),
        _c("start_ns", "i8", "ns"),
        _c("end_ns", "i8", "ns"),
    ),
    # Scheduling evidence of the `cuda_api` level's calls (trace.cuda_api_sched): one row per
    # events/cuda row of that level, same order, joined on (rank, tid, correlation, start_ns).
    # A table of its own, so that traces without it (and schema-1 readers) are unaffected.
    "events/cuda_sched": (
        _c("rank", "i2"),
        _c("tid", "i8", doc="host thread that made the call"),
        _c("correlation", "i8", doc="CUPTI correlation id of the events/cuda row"),
        _c("start_ns", "i8", "ns", "entry stamp of the events/cuda row"),
        _c("end_ns", "i8", "ns", "exit stamp of the events/cuda row"),
        _c(
            "thread_cpu_ns",
            "i8",
            "ns",
            "CPU time the thread used during the call (CLOCK_THREAD_CPUTIME_ID, exit - entry); "
            "off-CPU time is end_ns - start_ns - thread_cpu_ns; -1 when not measured",
        ),
        _c(
            "voluntary",
            "i4",
            "count",
            "voluntary context switches during the call (getrusage RUSAGE_THREAD ru_nvcsw: "
            "the thread slept or blocked); -1 when not measured",
        ),
        _c(
            "involuntary",
            "i4",
            "count",
            "involuntary context switches during the call (ru_nivcsw: preempted while "
            "runnable); -1 when not measured",
        ),
        _c("cpu_entry", "i2", doc="CPU the thread ran on at entry (sched_getcpu); -1 unknown"),
        _c("cpu_exit", "i2", doc="CPU the thread ran on at exit (sched_getcpu); -1 unknown"),
    ),
    # Exact scheduler events (trace.sched_events, root only: codl.trace.ftrace): every context
    # switch that involves a followed thread, and every wake-up of one, from the kernel's
    # sched_switch / sched_waking tracepoints on the run's clock (microsecond resolution).
    "events/sched_switch": (
        _c("rank", "i2", doc="rank whose recorder saw the event"),
        _c("t_ns", "i8", "ns"),
        _c("cpu", "i2", doc="CPU of the switch"),
        _c("prev_tid", "i8", doc="thread that left the CPU (0: idle)"),
        _c(
            "prev_state",
            "sym",
            doc="its state: R or R+ = still runnable (preempted); S, D, ... = went to sleep",
        ),
        _c("next_tid", "i8", doc="thread that took the CPU (0: idle)"),
    ),
    "events/sched_waking": (
        _c("rank", "i2", doc="rank whose recorder saw the event"),
        _c("t_ns", "i8", "ns"),
        _c("cpu", "i2", doc="CPU the wake-up was issued on"),
        _c("tid", "i8", doc="thread woken"),
        _c("waker_tid", "i8", doc="thread that woke it (0: an interrupt on an idle CPU)"),
        _c("target_cpu", "i2", doc="CPU it was queued on"),
    ),
    # Collectives: one row per AllReduce bucket.
    "events/comm": (
        _c("rank", "i2"),
        _c("step", "i4"),
        _c("bucket", "i4"),
        _c("op", "sym", doc="allreduce, group_allreduce, segment_allreduce"),
        _c("bytes", "i8", "bytes"),
        _c("start_ns", "i8", "ns"),
        _c("end_ns", "i8", "ns"),
        _c("gpu_ns", "i8", "ns", "GPU duration from CUDA events; -1 when not measured"),
    ),
    # GPU-side arrival of each AllReduce bucket on the node's host clock (CUDA event ranks only):
    # the GPU start of the bucket's collective, placed by the step's start event (recorded right
    # after the previous step's synchronisation, when the GPU is idle, so it runs at its host
    # stamp). One row per events/comm row with CUDA events, joined on (rank, step, bucket). A
    # table of its own, so that traces without it (and schema-1 readers) are unaffected.
    "events/comm_gpu": (
        _c("rank", "i2"),
        _c("step", "i4"),
        _c("bucket", "i4", doc="bucket index within the step, as in events/comm"),
        _c(
            "start_ns",
            "i8",
            "ns",
            "when the GPU reached the bucket (its start event): step start + elapsed GPU time",
        ),
        _c("end_ns", "i8", "ns", "start_ns + the collective's GPU duration"),
    ),
    # The launch roles' scheduler counters across one phase span (compute, data_wait, allreduce):
    # read just before the span opens and just after it closes, so a phase's CPU time and
    # run-queue wait are measured inside it, not over the whole step. One row per (span,
    # thread); the launch (main) thread's on-CPU time is its CLOCK_THREAD_CPUTIME_ID (schedstat
    # lags a running thread by up to a tick), other threads' is schedstat field 1.
    "events/phase_sched": (
        _c("rank", "i2"),
        _c("step", "i4"),
        _c("phase", "sym", doc=", ".join(SAMPLED_PHASES)),
        _c("tid", "i8", doc="thread whose counters these are (role in /threads)"),
        _c("start_ns", "i8", "ns", "start of the phase span"),
        _c("end_ns", "i8", "ns", "end of the phase span"),
        _c("run_ns", "i8", "ns", "on-CPU time during the span"),
        _c("wait_ns", "i8", "ns", "run-queue wait during the span (schedstat field 2)"),
        _c("timeslices", "i8", "count", "times run on a CPU during the span (schedstat field 3)"),
    ),
    # Per-thread OS scheduling counters, cumulative since thread start (take differences).
    "samples/sched": (
        _c("t_ns", "i8", "ns"),
        _c("rank", "i2"),
        _c("step", "i4", doc="step that just ended; -1 for the sample taken before step 0"),
        _c("pid", "i8"),
        _c("tid", "i8"),
        _c("run_ns", "i8", "ns", "time on CPU (schedstat field 1)"),
        _c("wait_ns", "i8", "ns", "time runnable but waiting in a run queue (schedstat field 2)"),
        _c("timeslices", "i8", "count", "times run on a CPU (schedstat field 3)"),
        _c("voluntary", "i8", "count", "voluntary_ctxt_switches"),
        _c("involuntary", "i8", "count", "nonvoluntary_ctxt_switches"),
        _c("cpu", "i2", doc="CPU the thread last ran on (stat field 39)"),
    ),
    # Per-core utilisation from /proc/stat, cumulative ticks (take differences).
    "samples/cpu": (
        _c("t_ns", "i8", "ns"),
        _c("rank", "i2"),
        _c("step", "i4"),
        _c("cpu", "i2"),
        _c("user", "i8", "ticks"),
        _c("system", "i8", "ticks"),
        _c("idle", "i8", "ticks"),
        _c("iowait", "i8", "ticks"),
        _c("other", "i8", "ticks", "nice + irq + softirq + steal"),
    ),
    # NVML device samples.
    "samples/device": (
        _c("t_ns", "i8", "ns"),
        _c("rank", "i2"),
        _c("step", "i4"),
        _c("gpu", "i2", doc="NVML device index"),
        _c("util_pct", "i2", "%"),
        _c("mem_util_pct", "i2", "%"),
        _c("mem_used", "i8", "bytes"),
        _c("sm_clock", "i4", "MHz"),
        _c("power", "i8", "mW"),
    ),
    # Every thread seen, with its role and CPU masks (planned by the policy and actually set).
    "threads": (
        _c("t_ns", "i8", "ns", "when the row was captured"),
        _c("rank", "i2"),
        _c("pid", "i8"),
        _c("tid", "i8"),
        _c("role", "sym", doc="launch, autograd, pin_memory, comm, loader, other"),
        _c("name", "sym", doc="/proc/<pid>/task/<tid>/comm"),
        _c("cpus_planned", "sym", doc="cpulist the policy asked for; '' when unpinned"),
        _c("cpus_actual", "sym", doc="cpulist from sched_getaffinity at capture"),
    ),
}


def empty_columns(table: str) -> dict[str, list[Any]]:
    """One empty list per column of ``table``: the recorders' row buffers, in schema order."""
    return {c.name: [] for c in TABLES[table]}


class Table(enum.StrEnum):
    """Every table's name, spelled once: code names a table as ``Table.APP``, not
    ``"events/app"``. A member is its string (``StrEnum``), so it indexes ``TABLES``, HDF5 paths
    and the readers' arguments unchanged; a test keeps the members equal to ``TABLES``' keys."""

    APP = "events/app"
    LOADER = "events/loader"
    CUDA = "events/cuda"
    CUDA_SCHED = "events/cuda_sched"
    SCHED_SWITCH = "events/sched_switch"
    SCHED_WAKING = "events/sched_waking"
    COMM = "events/comm"
    COMM_GPU = "events/comm_gpu"
    PHASE_SCHED = "events/phase_sched"
    SCHED = "samples/sched"
    CPU = "samples/cpu"
    DEVICE = "samples/device"
    THREADS = "threads"
