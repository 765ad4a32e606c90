"""One rank of one measured run: build the components the mode asks for, step, trace, write.

Timing discipline: every span is CLOCK_MONOTONIC ns taken on the launch thread; on CUDA each
phase is bracketed by CUDA events too, so the trace holds both the host view (when the launch
thread issued the work) and the GPU view (how long the GPU was busy with or waiting for it). A step
ends after a device synchronisation, and the OS samples are taken after the step span closes so
their cost never lands inside a measured step.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, cast

import numpy as np
import torch

from codl import __version__, pinning
from codl.errors import CodlError, RunInterruptedError
from codl.harness import data as hdata
from codl.harness import workloads
from codl.harness.comm import (
    CommRecorder,
    comm_group,
    cuda_event_pair,
    prepare_tensors,
    run_comm_step,
)
from codl.spec import DeviceKind, Mode, Policy, Precision, RunSpec
from codl.trace import cuda_api, kineto
from codl.trace.clock import now_ns, take_anchor
from codl.trace.device import DeviceSampler
from codl.trace.sched import SchedSampler
from codl.trace.schema import empty_columns
from codl.trace.store import TraceWriter


@dataclass(frozen=True)
class RankEnv:
    """Where this process sits in the job; filled from Slurm/submitit or the local launcher."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500


@dataclass
class _Recorder:
    """Application spans in column lists plus the CUDA event pairs still to be resolved."""

    rank: int
    # With the app level off only the step spans are kept: the step loop and every later
    # statistic need them, the per-phase breakdown is what the level adds.
    app: bool = True
    cuda_events: bool = False
    tid: int = field(default_factory=threading.get_native_id)
    rows: dict[str, list[Any]] = field(default_factory=lambda: empty_columns("events/app"))
    pending: list[tuple[int, Any, Any]] = field(default_factory=list)

    def span(self, step: int, phase: str, start: int, end: int, events: Any = None) -> None:
        if not self.app and phase != "step":
            return
        r = self.rows
        r["rank"].append(self.rank)
        r["step"].append(step)
        r["phase"].append(phase)
        r["tid"].append(self.tid)
        r["start_ns"].append(start)
        r["end_ns"].append(end)
        r["gpu_ns"].append(-1)
        if events is not None:
            self.pending.append((len(r["step"]) - 1, events[0], events[1]))

    def resolve_gpu(self) -> None:
        # elapsed_time is ms as float with ~0.5 us resolution; events are complete because every
        # step ended with a synchronisation.
        for idx, start, end in self.pending:
            self.rows["gpu_ns"][idx] = round(start.elapsed_time(end) * 1e6)
        self.pending.clear()

    def events(self) -> tuple[Any, Any] | None:
        return cuda_event_pair(self.cuda_events)

    @contextlib.contextmanager
    def phase(self, step: int, name: str, *, gpu: bool = True) -> Iterator[list[int]]:
        """Time the block as span ``name`` of ``step`` (host clock, and CUDA events if ``gpu``).

        Yields a list that holds ``[start_ns, end_ns]`` once the block has ended.
        """
        ev = self.events() if gpu else None
        times = [now_ns()]
        if ev:
            ev[0].record()
        yield times
        if ev:
            ev[1].record()
        times.append(now_ns())
        self.span(step, name, times[0], times[1], ev)


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_REPEAT_IGNORE_S = 5.0


def _stop_handler() -> Callable[[int, FrameType | None], None]:
    """SIGTERM/SIGINT handler of one run: raise RunInterruptedError to stop it.

    Repeats within _REPEAT_IGNORE_S of the first (Slurm and group-wide kills deliver several)
    are ignored, so they cannot interrupt the unwinding into the code that writes the trace
    (which then ignores both signals itself). A later one raises again: the first may have been
    swallowed, raised inside a finalizer where Python only prints it.
    """
    first: list[float] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if first and now - first[0] < _REPEAT_IGNORE_S:
            return
        first[:] = [now]
        raise RunInterruptedError(f"received {signal.Signals(signum).name}")

    return handler


def _git_revision() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _versions() -> dict[str, str]:
    import torchvision

    v = {
        "codl": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "numpy": np.__version__,
        "kernel": platform.release(),
    }
    if torch.cuda.is_available():
        v["cuda"] = str(torch.version.cuda)
        v["gpu"] = torch.cuda.get_device_name(0)
        with contextlib.suppress(Exception):
            v["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    return v


def _seed_worker(placement: pinning.Placement, seed: int, worker_id: int) -> None:
    # A group-wide SIGTERM/SIGINT (Slurm, Ctrl-C) reaches the workers too: they leave it to the
    # main process, which stops the run and shuts them down; otherwise a worker's death races
    # the main process's handler and the run ends in a DataLoader traceback.
    for s in _STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    pinning.apply_worker(placement, worker_id)
    np.random.seed(seed + worker_id)
    random.seed(seed + worker_id)


def _batches(loader: Any) -> Iterator[Any]:
    # The sampler never ends (hdata.EndlessShuffle): one iterator, no epoch boundary to drain.
    return iter(loader)


def execute(
    spec: RunSpec,
    *,
    trace_path: Path,
    dataset_dir: Path | None,
    env: RankEnv | None = None,
    kineto_dir: Path | None = None,
) -> Path:
    """Run ``spec`` as this rank and write its trace; returns the trace path.

    On an exception or SIGTERM the events measured so far are written to a file marked
    incomplete (``<stem>.incomplete.h5``) and the exception propagates: the run exits non-zero.
    """
    env = env or RankEnv()
    mode = spec.mode
    if mode.loads and dataset_dir is None:
        raise CodlError(f"mode {mode.value!r} reads a data set but no dataset_dir was given")
    stop = _stop_handler()
    previous = {s: signal.signal(s, stop) for s in _STOP_SIGNALS}
    # Oversubscribing the cores with workers is an experiment factor here, not a mistake.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    anchor_start = take_anchor()
    t_begin = now_ns()
    allowed = frozenset(os.sched_getaffinity(0))
    cuda = spec.device is DeviceKind.CUDA
    if cuda and not torch.cuda.is_available():
        raise CodlError("device 'cuda' requested but torch.cuda.is_available() is False")
    numa = cuda and spec.pinning.policy is Policy.NUMA
    placement = pinning.plan(
        spec.pinning,
        allowed=allowed,
        local_ranks=env.local_world_size,
        local_rank=env.local_rank,
        workers=spec.loader.workers if mode.loads else 0,
        roles=pinning.roles_for(spec),
        gpu=env.local_rank if cuda else None,
        gpu_cpus=pinning.gpu_local_cpus(env.local_rank) if numa else None,
    )
    launch_cpus = placement.launch if placement.launch is not None else placement.rank_cpus
    threads_before = torch.get_num_threads()
    if not cuda:
        # On CPU the intra-op pool does the compute; size it to the launch role's cores so that
        # a policy's core budget means the same on CPU and GPU. Threads inherit the launch
        # thread's mask because pinning happens before the first parallel region.
        torch.set_num_threads(max(1, len(launch_cpus)))
    # (capture time, rows): masks are read back and recorded at start, after step 0, after the
    # last warm-up step and at the end; launch roles found sharing a CPU in a reading are warned
    # about in the trace and the run log.
    thread_rows: list[tuple[int, pinning.ThreadRow]] = _stamped(pinning.apply_threads(placement))
    _log_placement(placement.warnings)
    crowded = pinning.crowded(placement, [r for _, r in thread_rows])
    _log_placement(crowded)

    torch.manual_seed(spec.seed + 1000 * spec.repeat + env.rank)
    np.random.seed(spec.seed + env.rank)
    random.seed(spec.seed + env.rank)
    device = torch.device("cuda", env.local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True

    rec = _Recorder(rank=env.rank, app=spec.trace.app, cuda_events=cuda and spec.trace.cuda_events)
    sched = SchedSampler(rank=env.rank, per_thread=spec.trace.sched, per_core=spec.trace.cpu)
    sched.track(os.getpid())
    dev = DeviceSampler(rank=env.rank, gpu_index=env.local_rank)
    if cuda and spec.trace.device:
        dev.start()
    comm_rec = CommRecorder(rank=env.rank)
    loader_items: list[np.ndarray] = []
    loader_collate: list[np.ndarray] = []
    loader_steps: list[int] = []
    attrs: dict[str, Any] = {}
    status = "failed"
    reason = ""
    profiler: Any = None
    api_tracer: cuda_api.ApiTracer | None = None
    loader: Any = None
    batches: Any = None
    pg_started = False
    try:
        if env.world_size > 1:
            pg_started = _init_process_group(spec, env)
        workload = workloads.get(spec.workload.model)
        model = workload.build_model(spec.workload).to(device)
        memory_format = (
            torch.channels_last
            if spec.workload.channels_last and workload.dataset_kind.value == "jpeg"
            else torch.contiguous_format
        )
        model = model.to(memory_format=memory_format)
        ddp_model: Any = model
        if pg_started and mode.computes and mode.communicates:
            ddp_model = _wrap_ddp(model, spec, env, comm_rec)
        optimizer = torch.optim.SGD(model.parameters(), lr=spec.workload.lr, momentum=0.9)
        is_volume = workload.dataset_kind.value == "volume"
        loss_fn: Any = torch.nn.MSELoss() if is_volume else torch.nn.CrossEntropyLoss()
        autocast = (
            torch.autocast(device_type=device.type, dtype=torch.bfloat16)
            if spec.workload.precision is Precision.BF16
            else contextlib.nullcontext()
        )
        bs = spec.workload.batch_size
        s = spec.workload.image_size
        if is_volume:
            shape: tuple[int, ...] = (bs, 4, s, s, s)
        else:
            shape = (bs, 3, s, s)
        synthetic_x = torch.randn(shape, device=device).to(memory_format=memory_format)
        synthetic_y = (
            torch.randn(bs, 4, device=device)
            if is_volume
            else torch.randint(0, spec.workload.classes, (bs,), device=device)
        )
        if mode.loads:
            if dataset_dir is None:  # pragma: no cover - checked above
                raise CodlError("no dataset_dir")
            dataset = hdata.dataset_for(workload.dataset_kind.value, dataset_dir, s)
            gen = torch.Generator().manual_seed(spec.seed + env.rank)
            n_samples = len(cast(Sized, dataset))
            if n_samples < bs:
                raise CodlError(
                    f"data set {dataset_dir} has {n_samples} samples, fewer than one batch of {bs}"
                )
            loader = torch.utils.data.DataLoader(
                dataset,
                batch_size=bs,
                sampler=hdata.EndlessShuffle(n_samples, gen),
                multiprocessing_context=hdata.worker_context() if spec.loader.workers else None,
                num_workers=spec.loader.workers,
                prefetch_factor=spec.loader.prefetch_factor,
                pin_memory=spec.loader.pin_memory and cuda,
                persistent_workers=spec.loader.persistent_workers,
                drop_last=True,
                collate_fn=hdata.collate,
                worker_init_fn=functools.partial(_seed_worker, placement, spec.seed),
            )
        batches = _batches(loader) if loader is not None else None
        comm_buckets = _bucket_sizes(model, spec.layout.bucket_cap_mb) if mode is Mode.COMM else []
        comm_tensors = prepare_tensors(comm_buckets, spec, device)
        group = comm_group(spec) if mode is Mode.COMM and pg_started else None
        sleep_s: float | None = None
        warm_compute: list[float] = []
        if spec.trace.cupti:
            profiler = kineto.start_window(spec, kineto_dir)
        if spec.trace.cuda_api:
            # From the first warm-up step: the subscription's one-off cost lands in warm-up.
            api_tracer = cuda_api.ApiTracer(sched=spec.trace.cuda_api_sched)
            api_tracer.start()
        sched.sample(-1)
        dev.sample(-1)
        for step in range(spec.steps.total):
            comm_rec.step = step
            t_step = now_ns()
            step_ev = rec.events()
            if step_ev:
                step_ev[0].record()
            x, y = synthetic_x, synthetic_y
            if batches is not None:
                with rec.phase(step, "data_wait", gpu=False):
                    batch = next(batches)
                if spec.trace.loader:
                    loader_items.append(batch.items)
                    loader_collate.append(batch.collate)
                    loader_steps.append(step)
                    # Batches arrive round-robin from the workers: track each new pid.
                    for pid in set(batch.items[:, 2].tolist()):
                        sched.track(int(pid))
                with rec.phase(step, "h2d"):
                    x = batch.inputs.to(device, non_blocking=spec.loader.pin_memory)
                    x = x.to(memory_format=memory_format)
                    y = batch.targets.to(device, non_blocking=spec.loader.pin_memory)
            run_compute = mode.computes or (mode.sleeps and step < spec.steps.warmup)
            if run_compute:
                with rec.phase(step, "compute") as compute:
                    with rec.phase(step, "forward"), autocast:
                        out = ddp_model(x)
                        loss = loss_fn(out.float(), y)
                    with rec.phase(step, "backward"):
                        loss.backward()
                    with rec.phase(step, "optimizer"):
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                        if mode.sleeps:
                            # The sleep replaces compute *as observed*, synchronisation included.
                            _sync(device)
                if mode.sleeps:
                    warm_compute.append((compute[1] - compute[0]) / 1e9)
            elif mode.sleeps:
                if sleep_s is None:
                    usable = warm_compute[1:] or warm_compute
                    sleep_s = statistics.median(usable)
                    attrs["sleep_ns"] = round(sleep_s * 1e9)
                with rec.phase(step, "sleep", gpu=False):
                    time.sleep(sleep_s)
            if mode is Mode.COMM:
                with rec.phase(step, "allreduce", gpu=False):
                    run_comm_step(comm_tensors, spec, comm_rec, cuda=cuda, group=group)
            if step_ev:
                step_ev[1].record()
            _sync(device)
            t_end = now_ns()
            comm_rec.flush(step)
            rec.span(step, "step", t_step, t_end, step_ev)
            if profiler is not None:
                profiler.step()
            sched.sample(step)
            dev.sample(step)
            if step in {0, spec.steps.warmup - 1}:
                # Autograd, pin-memory and communication threads exist only after step 0; threads
                # made later in the warm-up inherit their creator's CPUs, and are placed before
                # the measured steps.
                rows = pinning.apply_threads(placement)
                thread_rows += _stamped(rows)
                new = [w for w in pinning.crowded(placement, rows) if w not in crowded]
                _log_placement(new)
                crowded += new
        rec.resolve_gpu()
        status = "complete"
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
        with contextlib.suppress(Exception):
            rec.resolve_gpu()
        if profiler is not None:
            with contextlib.suppress(Exception):
                profiler.stop()
        cupti_rows: dict[str, Any] | None = None
        cuda_sched_rows: dict[str, Any] | None = None
        if profiler is not None and status == "complete":
            cupti_rows, cupti_attrs = kineto.collect(profiler, kineto_dir, rec, anchor_start)
            attrs.update(cupti_attrs)
        if api_tracer is not None:
            # Cheap and already on our clock: kept for incomplete runs too.
            try:
                api_tables, api_attrs = cuda_api.collect_tables(api_tracer, rec)
                cupti_rows = api_tables["events/cuda"]
                cuda_sched_rows = api_tables.get(cuda_api.SCHED_TABLE)
                attrs.update(api_attrs)
            except Exception as exc:
                attrs["cuda_api"] = f"lost: {type(exc).__name__}: {exc}"
            finally:
                with contextlib.suppress(Exception):
                    api_tracer.close()
        thread_rows += _stamped(_worker_thread_rows(loader_items, placement))
        thread_rows += _stamped(pinning.record_threads(placement))
        # Dropping the iterator and loader shuts the workers down before the trace is written.
        batches = None
        loader = None
        anchor_end = take_anchor()
        t_end_run = now_ns()
        if pg_started:
            with contextlib.suppress(Exception):
                torch.distributed.destroy_process_group()
        attrs.update(
            {
                "run_id": spec.run_id,
                "spec": spec.to_dict(),
                "host": socket.gethostname(),
                "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
                "git_revision": _git_revision(),
                "versions": _versions(),
                "anchors_start": anchor_start.as_dict(),
                "anchors_end": anchor_end.as_dict(),
                "t_begin_ns": t_begin,
                "t_end_ns": t_end_run,
                "warmup_steps": spec.steps.warmup,
                "measured_steps": spec.steps.measured,
                "rank": env.rank,
                "world_size": env.world_size,
                "clk_tck": os.sysconf("SC_CLK_TCK"),
                "allowed_cpus": pinning.cpulist(allowed),
                "placement": {**placement.to_dict(), "crowded": crowded},
                "placement_mismatches": pinning.mismatches(r for _, r in thread_rows),
                "device_level": dev.unavailable_reason or ("on" if dev.rows["t_ns"] else "off"),
            }
        )
        try:
            _write_trace(
                trace_path,
                complete=status == "complete",
                reason=reason,
                attrs=attrs,
                rec=rec,
                sched=sched,
                dev=dev,
                comm=comm_rec,
                loader=(loader_items, loader_collate, loader_steps, env.rank),
                threads=thread_rows,
                rank=env.rank,
                cupti=cupti_rows,
                cuda_sched=cuda_sched_rows,
            )
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        sched.close()
        dev.close()
        _restore_affinity(allowed)
        if not cuda:
            torch.set_num_threads(threads_before)
    return trace_path


def _restore_affinity(allowed: frozenset[int]) -> None:
    """Give every thread of this process the job's CPU set back.

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


def _worker_thread_rows(
    items: list[np.ndarray], placement: pinning.Placement
) -> list[pinning.ThreadRow]:
    """Threads of every loader worker seen in the loader events (pid -> worker id)."""
    workers: dict[int, int] = {}
    for arr in items:
        for worker, pid in arr[:, 1:3].tolist():
            workers.setdefault(int(pid), int(worker))
    rows: list[pinning.ThreadRow] = []
    for pid, worker in sorted(workers.items()):
        with contextlib.suppress(ProcessLookupError):
            rows += pinning.record_threads(placement, pid, worker_id=worker)
    return rows


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


def _wrap_ddp(model: Any, spec: RunSpec, env: RankEnv, comm: CommRecorder) -> Any:
    from torch.nn.parallel import DistributedDataParallel

    ids = [env.local_rank] if spec.device is DeviceKind.CUDA else None
    ddp = DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=spec.layout.bucket_cap_mb)
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


def _write_trace(
    path: Path,
    *,
    complete: bool,
    reason: str,
    attrs: dict[str, Any],
    rec: _Recorder,
    sched: SchedSampler,
    dev: DeviceSampler,
    comm: CommRecorder,
    loader: tuple[list[np.ndarray], list[np.ndarray], list[int], int],
    threads: list[tuple[int, pinning.ThreadRow]],
    rank: int,
    cupti: dict[str, Any] | None,
    cuda_sched: dict[str, Any] | None = None,
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = TraceWriter(path)
    with writer:
        writer.set_attrs(**attrs)
        writer.append("events/app", rec.rows)
        if sched.rows["tid"]:
            writer.append("samples/sched", sched.rows)
        if sched.cpu_rows["cpu"]:
            writer.append("samples/cpu", sched.cpu_rows)
        if dev.rows["t_ns"]:
            writer.append("samples/device", dev.rows)
        if comm.rows["bucket"]:
            writer.append("events/comm", comm.rows)
        items, collates, steps, rk = loader
        if items:
            writer.append("events/loader", _loader_columns(items, collates, steps, rk))
        if cupti:
            writer.append("events/cuda", cupti)
        if cuda_sched and cuda_sched["tid"]:
            writer.append("events/cuda_sched", cuda_sched)
        if threads:
            rows = [r for _, r in threads]
            writer.append(
                "threads",
                {
                    "t_ns": [t for t, _ in threads],
                    "rank": [rank] * len(rows),
                    "pid": [r.pid for r in rows],
                    "tid": [r.tid for r in rows],
                    "role": [str(r.role) for r in rows],
                    "name": [r.name for r in rows],
                    "cpus_planned": [r.cpus_planned for r in rows],
                    "cpus_actual": [r.cpus_actual for r in rows],
                },
            )
        if complete:
            writer.finish()
        else:
            writer.abort(reason or "run did not finish")


def _loader_columns(
    items: list[np.ndarray], collates: list[np.ndarray], steps: list[int], rank: int
) -> dict[str, Any]:
    """Expand per-item rows (fetch/decode/transform) and per-batch collate rows into events."""
    cols = empty_columns("events/loader")
    for arr, col, step in zip(items, collates, steps, strict=True):
        n = arr.shape[0]
        for stage, (a, b) in zip(
            ("fetch", "decode", "transform"), ((5, 6), (6, 7), (7, 8)), strict=True
        ):
            cols["rank"].extend([rank] * n)
            cols["step"].extend([step] * n)
            cols["worker"].extend(arr[:, 1].tolist())
            cols["pid"].extend(arr[:, 2].tolist())
            cols["tid"].extend(arr[:, 3].tolist())
            cols["cpu"].extend(arr[:, 4].tolist())
            cols["item"].extend(arr[:, 0].tolist())
            cols["stage"].extend([stage] * n)
            cols["start_ns"].extend(arr[:, a].tolist())
            cols["end_ns"].extend(arr[:, b].tolist())
        cols["rank"].append(rank)
        cols["step"].append(step)
        cols["worker"].append(int(col[0]))
        cols["pid"].append(int(col[1]))
        cols["tid"].append(int(col[2]))
        cols["cpu"].append(int(col[3]))
        cols["item"].append(-1)
        cols["stage"].append("collate")
        cols["start_ns"].append(int(col[4]))
        cols["end_ns"].append(int(col[5]))
    return cols


def write_spec_json(spec: RunSpec, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec.to_dict(), indent=2, sort_keys=True) + "\n")
