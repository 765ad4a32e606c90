"""One rank of one measured run: build the components the mode asks for, step, trace, write.

Timing discipline: every span is CLOCK_MONOTONIC ns taken on the launch thread; on CUDA each
phase is bracketed by CUDA events too, so the trace holds both the host view (when the launch
thread issued the work) and the GPU view (how long the GPU was busy with or waiting for it). A step
ends after a device synchronisation, and the OS samples are taken after the step span closes so
their cost never lands inside a measured step. The one exception is deliberate: the launch roles'
counters at the boundaries of the compute, data-wait and comm phases (trace.sched.PhaseSched, 3
syscalls per boundary) are read inside those spans, so that they measure exactly the span.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing.resource_sharer
import os
import random
import signal
import socket
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sized
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final, cast

import numpy as np
import torch

from codl import pinning
from codl.errors import CodlError, DataSetError, RunInterruptedError
from codl.files import REPEAT_IGNORE_S, restore_after_stop
from codl.harness import data as hdata
from codl.harness import workloads
from codl.harness.comm import CommRecorder, comm_group, prepare_tensors, run_comm_step
from codl.harness.handoff import RingLoader
from codl.harness.progress import StepProgress
from codl.harness.recorders import Recorders, RunContext, provenance
from codl.harness.recorders.loader_log import LoaderLog
from codl.harness.recorders.spans import AppSpans
from codl.spec import PLAN_ATTR, PLAN_ENV, DeviceKind, Handoff, Mode, Policy, Precision, RunSpec
from codl.trace import clock
from codl.trace.clock import Anchor, now_ns, take_anchor
from codl.trace.schema import Phase


@dataclass(frozen=True)
class RankEnv:
    """Where this process sits in the job; filled from Slurm/submitit or the local launcher."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    # Started by the local launcher from one process: the local ranks share its CPU set, so it
    # is split between them even where Slurm bound that process (pinning.task_bound).
    spawned: bool = False


# Steps between two hand-overs of the recorded rows to the trace writer: the recorders hold at
# most this many steps of loader and schedstat rows (ResNet-50, batch 128, 8 workers: ~40 k
# rows, a few MB as Python lists); the hand-over (~1 ms) falls between steps, outside every span.
DRAIN_EVERY_STEPS = 50
# CPython's own switch interval, read when the harness is imported, before any run sets one:
# what `runtime.switch_interval_ms: 0` leaves (5 ms in every CPython since 3.2).
_CPYTHON_SWITCH_INTERVAL_S = sys.getswitchinterval()
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


# A batch's tensors reach the rank as file descriptors, each fetched from the worker's
# multiprocessing resource sharer over a socket with a handshake (sharing strategy
# file_descriptor). A stop raised while the rank is inside that fetch cuts the handshake: the
# worker's sharer thread then prints a BrokenPipeError traceback into the run's stderr.
_FD_HANDOVER_CODE: Final = multiprocessing.resource_sharer.__file__
# How soon a stop that landed inside such a fetch is delivered again (again, if the next fetch
# has begun by then): a fetch is a few round trips on a local socket.
_HANDOVER_RETRY_S: Final = 0.01


def _in_fd_handover(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_filename == _FD_HANDOVER_CODE:
            return True
        frame = frame.f_back
    return False


class _StopHandler:
    """SIGTERM/SIGINT handler of one run: raise RunInterruptedError to stop it.

    Repeats within REPEAT_IGNORE_S of the first (Slurm and group-wide kills deliver several)
    are ignored, so they cannot interrupt the unwinding into the code that writes the trace
    (which then ignores both signals itself). A later one raises again: the first may have been
    swallowed, raised inside a finalizer where Python only prints it. A signal that lands while
    the rank fetches a loader worker's file descriptor is sent again once the fetch is over
    (see _FD_HANDOVER_CODE), so a stop never leaves a worker's traceback behind.
    """

    def __init__(self) -> None:
        self.first: float | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.first is not None and now - self.first < REPEAT_IGNORE_S:
            return
        if _in_fd_handover(frame):
            threading.Timer(_HANDOVER_RETRY_S, os.kill, (os.getpid(), signum)).start()
            return
        self.first = now
        raise RunInterruptedError(f"received {signal.Signals(signum).name}")

    def restore(self, previous: Mapping[signal.Signals, Any]) -> None:
        """Put the handlers from before the run back; after a stop, behind a grace handler that
        still ignores the kill's repeats (codl.files.restore_after_stop)."""
        restore_after_stop(previous, self.first)


def _seed_worker(placement: pinning.Placement, seed: int, nice: int, worker_id: int) -> None:
    # A group-wide SIGTERM/SIGINT (Slurm, Ctrl-C) reaches the workers too: they leave it to the
    # main process, which stops the run and shuts them down; otherwise a worker's death races
    # the main process's handler and the run ends in a DataLoader traceback.
    for s in _STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    pinning.apply_worker(placement, worker_id)
    if nice:
        # Linux's nice is per thread: this sets the worker's main thread, and every thread it
        # starts later (a tokenizer's pool, torch's intra-op threads) inherits it. Never below
        # the rank's own: lowering a nice value needs a privilege the run does not ask for.
        os.setpriority(os.PRIO_PROCESS, 0, max(nice, os.getpriority(os.PRIO_PROCESS, 0)))
    np.random.seed(seed + worker_id)
    random.seed(seed + worker_id)


def _batches(loader: Any) -> Iterator[Any]:
    # The sampler never ends (hdata.EndlessShuffle): one iterator, no epoch boundary to drain.
    return iter(loader)


def _shutdown_loader(batches: Iterator[Any] | None) -> None:
    """Stop a multi-process DataLoader iterator's workers the way it does itself (a sentinel to
    each, then join): torch has no public call for it; single-process iterators have none. The
    ring hand-off has its own."""
    if isinstance(batches, RingLoader):
        batches.close()
        return
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


@dataclass
class _Placed:
    """The rank's thread placement, and every reading of its threads' CPU masks."""

    placement: pinning.Placement
    # The CPUs the run may use (the job's set cut to pinning.cpus), and the job's own set, which
    # every thread gets back at the end.
    allowed: frozenset[int]
    job: frozenset[int]
    # Local ranks that share `allowed`: 1 where Slurm bound the task to its own CPUs.
    cpus_split: int
    # The intra-op pool size before the run, restored after it (CPU runs resize it).
    threads_before: int
    resized_pool: bool
    # (capture time, rows): masks are read back and recorded at start, after step 0, after the
    # last warm-up step and at the end; launch roles found sharing a CPU in a reading are warned
    # about in the trace and the run log.
    rows: list[tuple[int, pinning.ThreadRow]] = field(default_factory=list)
    crowded: list[str] = field(default_factory=list)

    def reapply(self) -> None:
        """Place the threads made since the last reading, and record the masks."""
        rows = pinning.apply_threads(self.placement)
        self.rows += _stamped(rows)
        new = [w for w in pinning.crowded(self.placement, rows) if w not in self.crowded]
        _log_placement(new)
        self.crowded += new

    def record_final(self, loader: LoaderLog) -> None:
        """The last reading: every loader worker's threads and this process's."""
        worker_rows: list[pinning.ThreadRow] = []
        for pid, worker in sorted(loader.workers().items()):
            with contextlib.suppress(ProcessLookupError):
                worker_rows += pinning.record_threads(self.placement, pid, worker_id=worker)
        self.rows += _stamped(worker_rows)
        self.rows += _stamped(pinning.record_threads(self.placement))

    def release(self) -> None:
        _restore_affinity(self.job)
        if self.resized_pool:
            torch.set_num_threads(self.threads_before)


@dataclass
class _Open:
    """What a run holds open and must release however it ends; filled as it is built."""

    pg_started: bool = False
    # The CPU (gloo) group the clock exchanges run over; None: the default group is gloo.
    clock_group: Any = None
    loader: Any = None
    batches: Any = None
    # The interpreter's settings before the run changed them (_apply_runtime), put back after.
    runtime: tuple[float, str] | None = None


def _apply_runtime(spec: RunSpec) -> tuple[float, str]:
    """Set the rank's switch interval and tensor sharing strategy (``runtime``, ``loader``)
    before anything starts a thread or a worker; returns the previous ones. Always set, not only
    when asked: runs made one after another in one process (``launch`` of one rank) would
    otherwise inherit the last run's interval."""
    tmp = torch.multiprocessing
    previous = (sys.getswitchinterval(), str(tmp.get_sharing_strategy()))
    interval_ms = spec.runtime.switch_interval_ms
    try:
        sys.setswitchinterval(interval_ms / 1000 if interval_ms > 0 else _CPYTHON_SWITCH_INTERVAL_S)
        tmp.set_sharing_strategy(spec.loader.sharing_strategy.value)
    except BaseException:
        _restore_runtime(previous)  # not half of the settings left behind
        raise
    return previous


def _restore_runtime(previous: tuple[float, str] | None) -> None:
    if previous is not None:
        sys.setswitchinterval(previous[0])
        torch.multiprocessing.set_sharing_strategy(previous[1])


@dataclass(frozen=True)
class _Components:
    """The model, its training step's parts and the data that feeds it."""

    model: Any  # DDP-wrapped when AllReduce rides on backward
    optimizer: torch.optim.Optimizer
    loss_fn: Any
    autocast: Any
    memory_format: torch.memory_format
    synthetic_x: torch.Tensor
    synthetic_y: torch.Tensor
    comm_tensors: Any
    group: Any


def execute(
    spec: RunSpec,
    *,
    trace_path: Path,
    dataset_dir: Path | None,
    env: RankEnv | None = None,
    kineto_dir: Path | None = None,
) -> Path:
    """Run ``spec`` as this rank and write its trace; returns the trace path.

    The steps: place the threads, build the components, run the step loop, write the trace.
    On an exception or SIGTERM the events measured so far are written to a file marked
    incomplete (``<stem>.incomplete.h5``) and the exception propagates: the run exits non-zero.
    """
    env = env or RankEnv()
    if spec.mode.loads and dataset_dir is None:
        raise CodlError(f"mode {spec.mode.value!r} reads a data set but no dataset_dir was given")
    # Oversubscribing the cores with workers is an experiment factor here, not a mistake.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    anchor_start = take_anchor()
    t_begin = now_ns()
    placed, device, rec = _prepare(spec, env, kineto_dir, anchor_start)
    _open_trace_writer(rec, placed, trace_path)
    held = _Open()
    complete = False
    reason = ""
    # Installed here, not earlier: from now on every way out of the run goes through the
    # `finally` below, which restores the previous handlers.
    stop = _StopHandler()
    previous = {s: signal.signal(s, stop) for s in _STOP_SIGNALS}
    try:
        parts = _build(spec, env, device, rec.ctx, held, dataset_dir, placed)
        rec.start()
        rec.sample(-1)
        _step_loop(spec, parts, held, rec, placed, device)
        _sync_clock_end(env, rec.ctx, held)
        rec.ctx.spans.resolve_gpu()
        complete = True
    except KeyboardInterrupt:
        reason = "interrupted (SIGINT)"
        raise
    except BaseException as exc:
        reason = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        # Ignored until the trace is written, restored after (below).
        for s in _STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        rec.stop(complete=complete)
        placed.record_final(rec.ctx.loader)
        _release(held, rec.ctx)
        anchor_end = take_anchor()
        t_end_run = now_ns()
        if held.pg_started:
            with contextlib.suppress(Exception):
                torch.distributed.destroy_process_group()
        rec.ctx.attrs.update(
            _run_attrs(spec, env, placed, (anchor_start, anchor_end), (t_begin, t_end_run))
        )
        try:
            rec.write(trace_path, complete=complete, reason=reason)
        finally:
            stop.restore(previous)
            try:
                rec.close()
            finally:
                # The process's CPUs back even when writing failed: a core budget
                # (pinning.cpus) confined every thread, and the next run starts from the job's.
                placed.release()
    return trace_path


def _prepare(
    spec: RunSpec, env: RankEnv, kineto_dir: Path | None, anchor_start: Anchor
) -> tuple[_Placed, torch.device, Recorders]:
    """Place the rank, pick its device and start its recorders; a failure after the placement
    gives the process its CPUs back (a core budget confined every thread)."""
    placed = _place(spec, env)
    try:
        device = _seed_and_device(spec, env)
        rec = Recorders.create(
            spec,
            rank=env.rank,
            local_rank=env.local_rank,
            placed=placed,
            kineto_dir=kineto_dir,
            anchor_start=anchor_start,
        )
        return placed, device, rec
    except BaseException:
        placed.release()
        raise


def _sync_clock_end(env: RankEnv, ctx: RunContext, held: _Open) -> None:
    if held.pg_started:
        try:
            _sync_clock(env, ctx, held, "end")
        except Exception as exc:
            # A peer that failed after its last step costs this rank its drift estimate,
            # not its measurements: the start offset alone still aligns it.
            ctx.attrs["clock_sync"]["end_error"] = f"{type(exc).__name__}: {exc}"


def _open_trace_writer(rec: Recorders, placed: _Placed, trace_path: Path) -> None:
    """Open the trace before measuring: the rows stream to its partial file during the run,
    and a trace that cannot be written fails the run now, not after an hour."""
    try:
        rec.open(trace_path)
    except BaseException:
        rec.close()
        placed.release()
        raise


def _place(spec: RunSpec, env: RankEnv) -> _Placed:
    """Plan this rank's CPUs, size the CPU intra-op pool, and pin the threads that exist now."""
    job = frozenset(os.sched_getaffinity(0))
    # A Slurm task bound to its own CPUs reads only those: cut and split for one rank there.
    bound = not env.spawned and pinning.task_bound(os.environ)
    split, _ = pinning.rank_split(env.local_world_size, env.local_rank, bound=bound)
    allowed = pinning.budget_cut(job, spec.pinning.cpus, split)
    if spec.device is DeviceKind.CUDA and not torch.cuda.is_available():
        raise CodlError("device 'cuda' requested but torch.cuda.is_available() is False")
    if allowed != job:
        # Every thread, not only the ones a policy pins: `none` pins nothing, and the loader
        # workers inherit the forking thread's mask.
        _restore_affinity(allowed)
    try:
        return _plan_and_pin(spec, env, allowed, job, bound=bound)
    except BaseException:
        _restore_affinity(job)
        raise


def _plan_and_pin(
    spec: RunSpec, env: RankEnv, allowed: frozenset[int], job: frozenset[int], *, bound: bool
) -> _Placed:
    cuda = spec.device is DeviceKind.CUDA
    numa = cuda and spec.pinning.policy is Policy.NUMA
    split, index = pinning.rank_split(env.local_world_size, env.local_rank, bound=bound)
    # The GPU stays the rank's own (local_rank) even when its CPU set is not split.
    placement = pinning.plan(
        spec.pinning,
        allowed=allowed,
        local_ranks=split,
        local_rank=index,
        workers=spec.loader.workers if spec.mode.loads else 0,
        roles=pinning.roles_for(spec),
        gpu=env.local_rank if cuda else None,
        gpu_cpus=pinning.gpu_local_cpus(env.local_rank) if numa else None,
        rank=env.local_rank if bound else None,
    )
    launch_cpus = placement.launch if placement.launch is not None else placement.rank_cpus
    placed = _Placed(
        placement,
        allowed,
        job,
        split,
        threads_before=torch.get_num_threads(),
        resized_pool=not cuda,
    )
    if not cuda:
        # On CPU the intra-op pool does the compute; size it to the launch role's cores so that
        # a policy's core budget means the same on CPU and GPU. Threads inherit the launch
        # thread's mask because pinning happens before the first parallel region.
        torch.set_num_threads(max(1, len(launch_cpus)))
    placed.rows = _stamped(pinning.apply_threads(placement))
    _log_placement(placement.warnings)
    placed.crowded = pinning.crowded(placement, [r for _, r in placed.rows])
    _log_placement(placed.crowded)
    return placed


def _seed_and_device(spec: RunSpec, env: RankEnv) -> torch.device:
    torch.manual_seed(spec.seed + 1000 * spec.repeat + env.rank)
    np.random.seed(spec.seed + env.rank)
    random.seed(spec.seed + env.rank)
    if spec.device is not DeviceKind.CUDA:
        return torch.device("cpu")
    device = torch.device("cuda", env.local_rank)
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True
    return device


def _build(
    spec: RunSpec,
    env: RankEnv,
    device: torch.device,
    ctx: RunContext,
    held: _Open,
    dataset_dir: Path | None,
    placed: _Placed,
) -> _Components:
    """Process group, model, optimizer, synthetic batch, loader and AllReduce buffers."""
    held.runtime = _apply_runtime(spec)
    mode = spec.mode
    if env.world_size > 1:
        held.pg_started = _init_process_group(spec, env)
        held.clock_group = _clock_group(spec)
        _sync_clock(env, ctx, held, "start")
    workload = workloads.get(spec.workload.model)
    model = workload.build_model(spec.workload).to(device)
    memory_format = (
        torch.channels_last
        if spec.workload.channels_last and workload.channels_last
        else torch.contiguous_format
    )
    model = model.to(memory_format=memory_format)
    ddp_model: Any = model
    if held.pg_started and mode.computes and mode.communicates:
        ddp_model = _wrap_ddp(model, spec, env, ctx.comm, workload.ddp_options(spec.workload))
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.workload.lr, momentum=0.9)
    loss_fn = workload.loss(spec.workload)
    autocast = (
        torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        if spec.workload.precision is Precision.BF16
        else contextlib.nullcontext()
    )
    synthetic_x, synthetic_y = _synthetic_batch(spec, workload, device, memory_format)
    if mode.loads:
        if dataset_dir is None:  # pragma: no cover - checked in execute
            raise CodlError("no dataset_dir")
        held.loader = _build_loader(spec, env, workload, dataset_dir, placed.placement, device)
    held.batches = _batches(held.loader) if held.loader is not None else None
    comm_buckets = _bucket_sizes(model, spec.layout.bucket_cap_mb) if mode is Mode.COMM else []
    return _Components(
        model=ddp_model,
        optimizer=optimizer,
        loss_fn=loss_fn,
        autocast=autocast,
        memory_format=memory_format,
        synthetic_x=synthetic_x,
        synthetic_y=synthetic_y,
        comm_tensors=prepare_tensors(comm_buckets, spec, device),
        group=comm_group(spec) if mode is Mode.COMM and held.pg_started else None,
    )


def _synthetic_batch(
    spec: RunSpec,
    workload: workloads.Loaded,
    device: torch.device,
    memory_format: torch.memory_format,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of the modes that do not load: drawn once, on the device, by the workload."""
    x, y = workload.synthetic_batch(spec.workload, device)
    return x.to(memory_format=memory_format), y


def _build_loader(
    spec: RunSpec,
    env: RankEnv,
    workload: workloads.Loaded,
    dataset_dir: Path,
    placement: pinning.Placement,
    device: torch.device,
) -> Any:
    bs = spec.workload.batch_size
    dataset = workload.open_dataset(dataset_dir, spec.workload)
    gen = torch.Generator().manual_seed(spec.seed + env.rank)
    n_samples = len(cast(Sized, dataset))
    if n_samples < bs:
        raise CodlError(
            f"data set {dataset_dir} has {n_samples} samples, fewer than one batch of {bs}"
        )
    init_fn = functools.partial(_seed_worker, placement, spec.seed, spec.loader.worker_nice)
    if spec.loader.handoff is Handoff.RING:
        return RingLoader(
            dataset,
            batch_size=bs,
            workers=spec.loader.workers,
            prefetch_factor=spec.loader.prefetch_factor,
            generator=gen,
            worker_init_fn=init_fn,
            page_lock=spec.loader.pin_memory and spec.device is DeviceKind.CUDA,
            device=device,
            copy_ahead=spec.loader.copy_ahead,
        )
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=bs,
        sampler=hdata.EndlessShuffle(n_samples, gen),
        multiprocessing_context=hdata.worker_context() if spec.loader.workers else None,
        num_workers=spec.loader.workers,
        prefetch_factor=spec.loader.prefetch_factor,
        pin_memory=spec.loader.pin_memory and spec.device is DeviceKind.CUDA,
        persistent_workers=spec.loader.persistent_workers,
        drop_last=True,
        collate_fn=workload.collate_fn(),
        worker_init_fn=init_fn,
    )


def _step_loop(
    spec: RunSpec,
    parts: _Components,
    held: _Open,
    rec: Recorders,
    placed: _Placed,
    device: torch.device,
) -> None:
    """Every warm-up and measured step; a step ends after a device synchronisation."""
    mode = spec.mode
    ctx = rec.ctx
    spans = ctx.spans
    sleep_s: float | None = None
    warm_compute: list[float] = []
    progress = StepProgress(
        rank=ctx.rank,
        world=spec.layout.world_size,
        total=spec.steps.total,
        warmup=spec.steps.warmup,
        batch=spec.workload.batch_size if mode.loads or mode.computes else 0,
    )
    for step in range(spec.steps.total):
        ctx.comm.step = step
        t_step = now_ns()
        step_ev = spans.events()
        if step_ev:
            step_ev[0].record()
        x, y = parts.synthetic_x, parts.synthetic_y
        if held.batches is not None:
            x, y = _next_batch(spec, step, held.batches, ctx, parts, device)
        run_compute = mode.computes or (mode.sleeps and step < spec.steps.warmup)
        if run_compute:
            compute_s = _train_step(spec, step, parts, spans, x, y, device)
            if mode.sleeps:
                warm_compute.append(compute_s)
        elif mode.sleeps:
            if sleep_s is None:
                usable = warm_compute[1:] or warm_compute
                sleep_s = statistics.median(usable)
                ctx.attrs["sleep_ns"] = round(sleep_s * 1e9)
            with spans.phase(step, Phase.SLEEP.value, gpu=False):
                time.sleep(sleep_s)
        if mode is Mode.COMM:
            with spans.phase(step, Phase.ALLREDUCE.value, gpu=False):
                run_comm_step(
                    parts.comm_tensors,
                    spec,
                    ctx.comm,
                    cuda=device.type == "cuda",
                    group=parts.group,
                )
        if step_ev:
            step_ev[1].record()
        _sync(device)
        t_end = now_ns()
        ctx.comm.flush(step, ref=(t_step, step_ev[0]) if step_ev else None)
        spans.span(step, Phase.STEP.value, t_step, t_end, step_ev)
        rec.step_end(step)
        rec.sample(step)
        if (step + 1) % DRAIN_EVERY_STEPS == 0:
            rec.flush()
        progress.step_done(step)
        if step in {0, spec.steps.warmup - 1}:
            # Autograd, pin-memory and communication threads exist only after step 0; threads
            # made later in the warm-up inherit their creator's CPUs, and are placed before
            # the measured steps.
            placed.reapply()
            rec.threads_placed()
    if isinstance(held.batches, RingLoader) and held.batches.copy_ahead:
        # Whether the copies were made ahead at all: a batch not yet filled when the one before
        # went to the device is copied in its own H2D phase.
        ctx.attrs["copied_ahead"] = held.batches.ahead_count


def _next_batch(
    spec: RunSpec,
    step: int,
    batches: Iterator[hdata.Batch],
    ctx: RunContext,
    parts: _Components,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    with ctx.spans.phase(step, Phase.DATA_WAIT.value, gpu=False):
        try:
            batch = next(batches)
        except DataSetError as exc:
            # The ring's message is already one line naming the worker, its pid and the sample.
            if isinstance(batches, RingLoader):
                raise
            # Re-raised by the DataLoader with the worker's whole traceback as its message: keep
            # the last line, the one that names the file.
            raise DataSetError(str(exc).strip().splitlines()[-1].split("Error: ", 1)[-1]) from None
    ctx.loader.add(step, batch)
    with ctx.spans.phase(step, Phase.H2D.value):
        if isinstance(batches, RingLoader):
            x, y = batches.to_device(batch, device)
        else:
            x = batch.inputs.to(device, non_blocking=spec.loader.pin_memory)
            y = batch.targets.to(device, non_blocking=spec.loader.pin_memory)
        x = x.to(memory_format=parts.memory_format)
    return x, y


def _train_step(
    spec: RunSpec,
    step: int,
    parts: _Components,
    spans: AppSpans,
    x: torch.Tensor,
    y: torch.Tensor,
    device: torch.device,
) -> float:
    """Forward, backward and optimizer step; returns the compute span in seconds."""
    with spans.phase(step, Phase.COMPUTE.value) as compute:
        with spans.phase(step, Phase.FORWARD.value), parts.autocast:
            out = parts.model(x)
            loss = parts.loss_fn(out.float(), y)
        with spans.phase(step, Phase.BACKWARD.value):
            loss.backward()
        with spans.phase(step, Phase.OPTIMIZER.value):
            parts.optimizer.step()
            parts.optimizer.zero_grad(set_to_none=True)
            if spec.mode.sleeps:
                # The sleep replaces compute *as observed*, synchronisation included.
                _sync(device)
    return (compute[1] - compute[0]) / 1e9


def _release(held: _Open, ctx: RunContext) -> None:
    """The loader's workers and the interpreter's settings, given back before the trace is
    written; the settings the run had go into the trace first."""
    # The workers are shut down here, explicitly, before the trace is written: dropping the
    # iterator is not enough when an exception's traceback still holds it, and the workers
    # ignore SIGTERM (see _seed_worker), so multiprocessing's exit-time terminate-and-join
    # of a live worker would wait for ever.
    _shutdown_loader(held.batches)
    held.batches = None
    held.loader = None
    ctx.attrs.update(_runtime_attrs())
    _restore_runtime(held.runtime)


def _runtime_attrs() -> dict[str, Any]:
    """The interpreter's settings the run had, read back (the spec's asked-for values are in
    ``spec``): a GIL experiment's rows are told apart by what was applied."""
    return {
        "switch_interval_s": sys.getswitchinterval(),
        "sharing_strategy": str(torch.multiprocessing.get_sharing_strategy()),
    }


def _run_attrs(
    spec: RunSpec,
    env: RankEnv,
    placed: _Placed,
    anchors: tuple[Anchor, Anchor],
    times: tuple[int, int],
) -> dict[str, Any]:
    """The trace's root attributes: provenance, clocks, layout and placement."""
    return {
        "run_id": spec.run_id,
        "spec": spec.to_dict(),
        "host": socket.gethostname(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
        **_block_attrs(spec, anchors[0], times[0]),
        "git_revision": provenance.git_revision(),
        "versions": provenance.versions(),
        "anchors_start": anchors[0].as_dict(),
        "anchors_end": anchors[1].as_dict(),
        "t_begin_ns": times[0],
        "t_end_ns": times[1],
        "warmup_steps": spec.steps.warmup,
        "measured_steps": spec.steps.measured,
        "rank": env.rank,
        "world_size": env.world_size,
        "clk_tck": os.sysconf("SC_CLK_TCK"),
        "allowed_cpus": pinning.cpulist(placed.allowed),
        "job_cpus": pinning.cpulist(placed.job),
        "cpus_split": placed.cpus_split,
        "placement": {**placed.placement.to_dict(), "crowded": placed.crowded},
        "placement_mismatches": pinning.mismatches(r for _, r in placed.rows),
    }


def _block_attrs(spec: RunSpec, anchor: Anchor, t_begin_ns: int) -> dict[str, Any]:
    """Where and when the run ran, for blocks (runs back to back on one machine, one
    invocation: codl.analysis.runlevel.block_id): boot id, GPU UUIDs, the invocation token
    (Slurm job, or what the workflow set) and the wall-clock start."""
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot_id = ""
    uuids: list[str] = []
    if spec.device is DeviceKind.CUDA and torch.cuda.is_available():
        props = (torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count()))
        uuids = [str(p.uuid) for p in props]
    return {
        "boot_id": boot_id,
        "gpu_uuids": uuids,
        "invocation": os.environ.get("SLURM_JOB_ID") or os.environ.get("CODL_INVOCATION", ""),
        "start_unix_ns": anchor.to_realtime(t_begin_ns),
        # The plan the workflow froze for this run's config, if any (codl.plan_registry).
        PLAN_ATTR: os.environ.get(PLAN_ENV, ""),
    }


def _restore_affinity(allowed: frozenset[int]) -> None:
    """Give every thread of this process the CPU set ``allowed``: the job's set back at the end,
    the run's budget (``pinning.cpus``) at the start.

    A run may execute inside a longer-lived process (tests, benchmarks alternating runs); the
    next run must start from the set the job was given, not from this run's launch cores.
    """
    for info in pinning.discover_threads():
        with contextlib.suppress(ProcessLookupError, OSError):
            os.sched_setaffinity(info.tid, allowed)


def _log_placement(lines: Iterable[str]) -> None:
    # The workflow sends a run's stderr to its log; the trace keeps the same lines.
    for line in lines:
        print(f"codl run: placement warning: {line}", file=sys.stderr, flush=True)


def _stamped(rows: list[pinning.ThreadRow]) -> list[tuple[int, pinning.ThreadRow]]:
    t = now_ns()
    return [(t, r) for r in rows]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _init_process_group(spec: RunSpec, env: RankEnv) -> bool:
    import torch.distributed as dist

    # NCCL names its service/progress threads only when asked; without names they would be
    # role "other" and escape the launch-role pinning.
    os.environ.setdefault("NCCL_SET_THREAD_NAME", "1")
    os.environ.setdefault("MASTER_ADDR", env.master_addr)
    os.environ.setdefault("MASTER_PORT", str(env.master_port))
    dist.init_process_group(
        backend=spec.layout.backend.value,
        rank=env.rank,
        world_size=env.world_size,
        device_id=torch.device("cuda", env.local_rank) if spec.device is DeviceKind.CUDA else None,
    )
    return True


def _clock_group(spec: RunSpec) -> Any:
    """A gloo group for the clock exchange: host timestamps must not ride through a GPU."""
    import torch.distributed as dist

    if spec.layout.backend.value == "gloo":
        return None
    # new_group is collective; every rank makes it here, before any other subgroup.
    return dist.new_group(backend="gloo")


def _sync_clock(env: RankEnv, ctx: RunContext, held: _Open, when: str) -> None:
    """Measure this rank's clock against rank 0's (``when``: start or end of the run); the
    merge puts every rank on rank 0's clock with it (``codl.trace.clock``)."""
    sync = ctx.attrs.setdefault(
        "clock_sync",
        {"clock_id": clock.clock_identity(), "granularity_ns": clock.clock_granularity_ns()},
    )
    sync[when] = clock.exchange(held.clock_group, env.rank, env.world_size).as_dict()


def _wrap_ddp(
    model: Any, spec: RunSpec, env: RankEnv, comm: CommRecorder, options: Mapping[str, Any]
) -> Any:
    from torch.nn.parallel import DistributedDataParallel

    ids = [env.local_rank] if spec.device is DeviceKind.CUDA else None
    # The workload's hints (workloads.DDP_OPTIONS, checked at plan time) over DDP's defaults.
    ddp = DistributedDataParallel(
        model, device_ids=ids, bucket_cap_mb=spec.layout.bucket_cap_mb, **options
    )
    if spec.trace.comm:
        ddp.register_comm_hook(comm, CommRecorder.ddp_hook)
    return ddp


def _bucket_sizes(model: Any, cap_mb: int) -> list[int]:
    """Gradient bucket sizes (elements) exactly as DDP forms them, in the order it reduces them.

    DDP's own assignment: a small first bucket (``_DEFAULT_FIRST_BUCKET_BYTES``) so that
    communication starts early, then ``bucket_cap_mb`` buckets; the list is reversed because
    gradients become ready from the last layer backwards.
    """
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.requires_grad]
    # Private but stable since torch 1.x; DDP itself calls exactly these.
    first = dist._DEFAULT_FIRST_BUCKET_BYTES  # type: ignore[attr-defined]
    assign = dist._compute_bucket_assignment_by_size  # type: ignore[attr-defined]
    indices, _ = assign(params, [first, cap_mb * 1024 * 1024], [False] * len(params))
    return [sum(params[i].numel() for i in bucket) for bucket in reversed(indices)]


def write_spec_json(spec: RunSpec, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec.to_dict(), indent=2, sort_keys=True) + "\n")
