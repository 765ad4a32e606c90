"""Run specifications: what one measured run is, and its identity.

A run is a frozen tree of dataclasses. Its ``run_id`` is a short hash of the canonical JSON of the
*normalized* spec (sorted keys, defaults filled, fields the mode does not use reset to defaults), so
that output paths depend only on what the run actually does: editing the loader's worker count
re-runs the runs that load data, not the compute-only runs whose loader never starts.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import hashlib
import json
import math
import re
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar, Union, get_args, get_origin

from codl.errors import CodlError, ConfigError

RUN_ID_LENGTH = 12
# Fields added after run ids were first published, left out of the id while at their default so
# that every run measured before them keeps its id (and its results stay valid).
_ID_OPTIONAL_DEFAULTS: dict[tuple[str, str], Any] = {
    ("trace", "cuda_api"): False,
    ("trace", "cuda_api_sched"): False,
    ("trace", "sched_events"): False,
    ("trace", "compression"): "blosc-lz4",
    ("pinning", "autograd"): "own",
    ("pinning", "pin_memory"): "own",
    ("pinning", "comm"): "own",
    ("dataset", "cost"): "standard",
    ("pinning", "cpus"): 0,
    ("loader", "sharing_strategy"): "file_descriptor",
    ("loader", "handoff"): "torch",
    ("loader", "worker_nice"): 0,
    ("loader", "copy_ahead"): False,
    ("runtime", "switch_interval_ms"): 0.0,
    ("workload", "seq_len"): 128,
    ("dataset", "generator"): "",
}
#: The longest switch interval a run may ask for: past a second a thread waiting for the GIL
#: would starve for the whole of a step, which measures nothing useful.
MAX_SWITCH_INTERVAL_MS = 1000.0
#: The shortest: CPython keeps the interval in whole microseconds, so a shorter one would run
#: with an interval of 0 (a switch request at every check) and be recorded as 0.
MIN_SWITCH_INTERVAL_MS = 0.001
#: The highest nice value Linux has (the lowest priority).
MAX_NICE = 19
#: ``pinning.launch_cores: auto`` sizes the launch set from the roles it must hold.
AUTO: Literal["auto"] = "auto"
# Policy `none` reads no other pinning key; its runs were published with `launch_cores: 1` (the
# default then), and normalizing to that value keeps their ids now that the default is `auto`.
_UNREAD_LAUNCH_CORES = 1
# \Z, not $: Python's $ also matches before a trailing newline, which would let "name\n"
# through into paths and shell words. The config schema uses the same pattern text.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
# Loader workers per rank, whatever the machine: an absolute fork-bomb guard. `codl run` also
# refuses more than WORKERS_PER_CPU workers per CPU of the job.
MAX_LOADER_WORKERS = 1024
# The largest run seed (config schema: `seed`): numpy's legacy seeding (np.random.seed) takes 32
# bits, and ranks and loader workers add their index; a larger seed failed at run start.
MAX_SEED = 2**31 - 1
WORKERS_PER_CPU = 16


class Mode(enum.StrEnum):
    """Which pipeline components run (docs/design.md sect. 4)."""

    DATA = "data"
    COMPUTE = "compute"
    COMM = "comm"
    COMPUTE_COMM = "compute+comm"
    DATA_COMPUTE = "data+compute"
    COMBINED = "combined"
    DATA_SLEEP = "data+sleep"

    @property
    def loads(self) -> bool:
        return self in {Mode.DATA, Mode.DATA_COMPUTE, Mode.COMBINED, Mode.DATA_SLEEP}

    @property
    def computes(self) -> bool:
        return self in {Mode.COMPUTE, Mode.COMPUTE_COMM, Mode.DATA_COMPUTE, Mode.COMBINED}

    @property
    def communicates(self) -> bool:
        return self in {Mode.COMM, Mode.COMPUTE_COMM, Mode.COMBINED}

    @property
    def sleeps(self) -> bool:
        return self is Mode.DATA_SLEEP

    @property
    def components(self) -> tuple[Mode, ...]:
        """The single-component modes whose isolation runs this mode is compared against."""
        parts = []
        if self.loads:
            parts.append(Mode.DATA)
        if self.computes or self.sleeps:
            parts.append(Mode.COMPUTE)
        if self.communicates:
            parts.append(Mode.COMM)
        return tuple(parts)

    @property
    def is_isolation(self) -> bool:
        return self in {Mode.DATA, Mode.COMPUTE, Mode.COMM}

    @property
    def compute_twin(self) -> Mode | None:
        """A training mode with a loader without it: the twin the advisor and the interference
        map hold its compute against (data+compute -> compute, combined -> compute+comm);
        None for a mode that does not both load and compute."""
        if not (self.loads and self.computes):
            return None
        return Mode.COMPUTE_COMM if self.communicates else Mode.COMPUTE


class Policy(enum.StrEnum):
    """CPU-set policy for loader workers and launch threads (docs/design.md sect. 7; table in
    ``codl.pinning``). ``isolated-main`` isolates the main thread alone and puts the other launch
    roles with the loader workers, so that a matrix separates "launch thread alone" from "all
    launch roles together" (``isolated``)."""

    NONE = "none"
    SHARED = "shared"
    ISOLATED = "isolated"
    ISOLATED_MAIN = "isolated-main"
    SPREAD = "spread"
    NUMA = "numa"


class RolePlace(enum.StrEnum):
    """Where a launch helper thread (autograd, pin-memory, comm) runs under a pinned policy."""

    #: a CPU of its own in the launch set
    OWN = "own"
    #: on the main thread's CPU: the pile-up, only when asked for
    MAIN = "main"
    #: on the loader workers' CPUs
    LOADER = "loader"


class DeviceKind(enum.StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


class TraceCompression(enum.StrEnum):
    """How the trace's columns are compressed (docs/trace-format.md, "Compression")."""

    #: Blosc with LZ4 and byte shuffle (HDF5 filter 32001, from hdf5plugin): ~2.5x less tracer
    #: CPU per event than gzip at 7-18 % more bytes; readers outside codl need the Blosc plugin.
    BLOSC_LZ4 = "blosc-lz4"
    #: shuffle + deflate level 1: every HDF5 build reads it without plugins.
    GZIP = "gzip"


class Backend(enum.StrEnum):
    GLOO = "gloo"
    NCCL = "nccl"


class Precision(enum.StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"


class DatasetKind(enum.StrEnum):
    JPEG = "jpeg"
    VOLUME = "volume"
    #: documents of varied length and the BPE tokenizer trained on them (codl.datasets)
    TEXT = "text"
    #: built by a workload's own generator (``dataset.generator``, codl.harness.workloads)
    WORKLOAD = "workload"


class DatasetCost(enum.StrEnum):
    """Per-sample loader cost of a JPEG data set: how samples are stored and augmented."""

    #: pre-decoded uint8 arrays, random crop + flip: no decode, the loader keeps up
    LIGHT = "light"
    #: JPEG decode + the ImageNet training augmentation (RandomResizedCrop, flip, normalize)
    STANDARD = "standard"
    #: JPEG decode + ImageNet augmentation + colour jitter + Gaussian blur: a starved loader
    HEAVY = "heavy"


class CommPattern(enum.StrEnum):
    """How `comm` mode drives AllReduce over the model's gradient buckets."""

    BUCKETS = "buckets"
    SUBGROUPS = "subgroups"
    SEGMENTED = "segmented"


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """A generated data set; the `dataset` rule builds it under resources/datasets/<name>/."""

    name: str = "synthetic-jpeg"
    kind: DatasetKind = DatasetKind.JPEG
    samples: int = 256
    classes: int = 10
    height: int = 96
    width: int = 128
    depth: int = 32
    quality: int = 90
    seed: int = 0
    tier: str = "default"
    cost: DatasetCost = DatasetCost.STANDARD
    #: kind ``workload``: the workload whose generator builds the set (a registered name,
    #: ``package.module:factory`` or an entry point of ``codl.workloads``); filled with the
    #: run's ``workload.model`` when left empty
    generator: str = ""


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    model: str = "resnet_tiny"
    batch_size: int = 16
    image_size: int = 64
    classes: int = 10
    precision: Precision = Precision.FP32
    channels_last: bool = False
    lr: float = 0.01
    #: tokens per training sequence (language-model workloads; image workloads ignore it)
    seq_len: int = 128


class SharingStrategy(enum.StrEnum):
    """How loader workers hand a batch's tensors to the rank (torch.multiprocessing's sharing
    strategy): a file descriptor passed per storage (Linux's default) or a named file in
    /dev/shm that the rank maps."""

    FILE_DESCRIPTOR = "file_descriptor"
    FILE_SYSTEM = "file_system"


class Handoff(enum.StrEnum):
    """How a batch gets from the loader workers into the rank (``codl.harness.handoff``):
    ``torch`` is torch's DataLoader (batches pickled to the rank, a pin-memory thread copies
    them into page-locked memory when ``pin_memory``); ``ring`` is ours: the workers collate
    into a ring of shared slots that the rank page-locks once (when ``pin_memory``), so per
    batch the rank waits on a semaphore and starts one copy, with no thread of its own."""

    TORCH = "torch"
    RING = "ring"


@dataclass(frozen=True, kw_only=True)
class LoaderSpec:
    workers: int = 2
    prefetch_factor: int = 2
    pin_memory: bool = False
    persistent_workers: bool = True
    sharing_strategy: SharingStrategy = SharingStrategy.FILE_DESCRIPTOR
    handoff: Handoff = Handoff.TORCH
    #: the workers' nice value (Linux's per-thread priority, 0..19): at 19 a launch thread that
    #: wakes on a CPU a worker holds gets it at once, so workers may outnumber the cores
    worker_nice: int = 0
    #: ``handoff: ring`` only: the next batch's copy to the GPU started one batch ahead, on the
    #: ring's stream, so that it overlaps the current batch's compute (``codl.harness.handoff``)
    copy_ahead: bool = False

    def normalized(self) -> LoaderSpec:
        """The ring shares no tensor through torch.multiprocessing: its sharing strategy is
        never read, and must not make two ids of one run."""
        if self.handoff is Handoff.RING:
            return dataclasses.replace(self, sharing_strategy=SharingStrategy.FILE_DESCRIPTOR)
        return self


@dataclass(frozen=True, kw_only=True)
class RuntimeSpec:
    """The rank's Python interpreter. ``switch_interval_ms`` is CPython's switch interval
    (``sys.setswitchinterval``): how long a thread that wants the GIL waits before it asks the
    holder to let go. 0 leaves CPython's own (5 ms). Set in every rank before its loader starts,
    and recorded in the trace, so that a wait whose length follows it is shown to be a GIL wait."""

    switch_interval_ms: float = 0.0


@dataclass(frozen=True, kw_only=True)
class PinningSpec:
    """Placement of a rank's threads and loader workers (``codl.pinning`` has the table).

    ``launch_cores`` is the size of the launch set: the main thread's CPU plus one CPU per helper
    role placed ``own``; ``auto`` sizes it from the roles the run has, a number larger than that
    leaves spare CPUs for the other threads, a smaller one is an error when the run starts.
    ``autograd``, ``pin_memory`` and ``comm`` place those threads (read by every pinned policy
    except ``isolated-main``, which puts them with the loader workers).
    ``cpus`` is the run's core budget, read by every policy: the job's ranks on a node are
    confined to the first ``cpus x ranks_per_node`` CPUs (sorted ids) of the job's allowed set
    before anything is placed (a rank whose Slurm task is bound to its own CPUs: to the first
    ``cpus`` of those, ``codl.pinning.task_bound``); 0 keeps the whole allowed set.
    """

    policy: Policy = Policy.NONE
    launch_cores: int | Literal["auto"] = AUTO
    autograd: RolePlace = RolePlace.OWN
    pin_memory: RolePlace = RolePlace.OWN
    comm: RolePlace = RolePlace.OWN
    cpus: int = 0

    def normalized(self) -> PinningSpec:
        """This spec with the keys its policy never reads reset (they must not change ids)."""
        if self.policy is Policy.NONE:
            return PinningSpec(
                policy=Policy.NONE, launch_cores=_UNREAD_LAUNCH_CORES, cpus=self.cpus
            )
        if self.policy is Policy.ISOLATED_MAIN:
            return PinningSpec(policy=self.policy, launch_cores=self.launch_cores, cpus=self.cpus)
        return self


@dataclass(frozen=True, kw_only=True)
class LayoutSpec:
    nodes: int = 1
    ranks_per_node: int = 1
    backend: Backend = Backend.GLOO
    comm_pattern: CommPattern = CommPattern.BUCKETS
    bucket_cap_mb: int = 25

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True, kw_only=True)
class StepsSpec:
    warmup: int = 2
    measured: int = 10

    @property
    def total(self) -> int:
        return self.warmup + self.measured


@dataclass(frozen=True, kw_only=True)
class TraceSpec:
    """Tracing levels; each can be switched off. `cupti` (Kineto: runtime API calls and kernels
    of a window of steps) is expensive and off by default; `cuda_api` (CUPTI callbacks: the
    latency of every launch, memcpy/memset and synchronisation call on every step) is the cheap
    way to get per-call runtime API latency. CUPTI takes one subscriber: they exclude each other.
    `cuda_api_sched` adds each call's scheduling evidence (thread CPU time, voluntary and
    involuntary context switches): two syscalls per call, so off unless asked for.
    `sched_events` records every context switch and wake-up of the rank's threads from the
    kernel's scheduler tracepoints (ftrace; root only): exact off-CPU intervals, the preempter
    and the waker, at their real times. `compression` is the trace file's codec: Blosc/LZ4
    (cheap for the tracer, the default) or gzip (readable by any HDF5 build without plugins)."""

    app: bool = True
    loader: bool = True
    sched: bool = True
    cpu: bool = True
    cuda_events: bool = True
    comm: bool = True
    device: bool = True
    cupti: bool = False
    cupti_steps: int = 2
    cuda_api: bool = False
    cuda_api_sched: bool = False
    sched_events: bool = False
    compression: TraceCompression = TraceCompression.BLOSC_LZ4


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    mode: Mode = Mode.COMBINED
    device: DeviceKind = DeviceKind.CPU
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    dataset: DatasetSpec = field(default_factory=DatasetSpec)
    loader: LoaderSpec = field(default_factory=LoaderSpec)
    pinning: PinningSpec = field(default_factory=PinningSpec)
    layout: LayoutSpec = field(default_factory=LayoutSpec)
    steps: StepsSpec = field(default_factory=StepsSpec)
    trace: TraceSpec = field(default_factory=TraceSpec)
    runtime: RuntimeSpec = field(default_factory=RuntimeSpec)
    seed: int = 0
    repeat: int = 0

    def normalized(self) -> RunSpec:
        """The spec with fields its mode never reads reset to defaults: they must not change ids."""
        spec = dataclasses.replace(
            self, pinning=self.pinning.normalized(), loader=self.loader.normalized()
        )
        if not self.mode.loads:
            spec = dataclasses.replace(spec, loader=LoaderSpec(), dataset=DatasetSpec())
        return spec

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)  # type: ignore[no-any-return]

    def canonical_json(self) -> str:
        d = self.normalized().to_dict()
        for (group, key), default in _ID_OPTIONAL_DEFAULTS.items():
            if d[group][key] == default:
                del d[group][key]
        # A group added after ids were published (runtime) is left out whole while every key
        # of it is at its default, for the same reason.
        for group in {g for g, _ in _ID_OPTIONAL_DEFAULTS}:
            if not d[group]:
                del d[group]
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @functools.cached_property
    def run_id(self) -> str:
        # Cached (in the instance __dict__, which a frozen dataclass still has): the workflow
        # asks for the ids of a 1,000-run matrix several times per DAG build.
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:RUN_ID_LENGTH]

    def with_mode(self, mode: Mode) -> RunSpec:
        return dataclasses.replace(self, mode=mode)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "") -> RunSpec:
        problems: list[str] = []
        spec = _from_mapping(cls, data, where, problems)
        if problems:
            raise ConfigError(problems)
        if not isinstance(spec, RunSpec):  # pragma: no cover - _from_mapping returns cls
            raise TypeError(spec)
        if spec.dataset.kind is DatasetKind.WORKLOAD and not spec.dataset.generator:
            # The usual case: the run's own workload builds the set it reads.
            dataset = dataclasses.replace(spec.dataset, generator=spec.workload.model)
            spec = dataclasses.replace(spec, dataset=dataset)
        problems = spec.problems(where)
        if problems:
            raise ConfigError(problems)
        return spec

    def problems(self, where: str = "") -> list[str]:
        """Semantic checks the JSON Schema cannot express; one line per problem."""
        p = f"{where}." if where else ""
        out = self._range_problems(p)
        if not 1 <= self.dataset.quality <= 100:
            out.append(f"{p}dataset.quality: got {self.dataset.quality}, expected 1..100")
        for key, name in (("dataset.name", self.dataset.name), ("dataset.tier", self.dataset.tier)):
            if not SAFE_NAME.match(name):
                out.append(
                    f"{p}{key}: got {name!r}, expected letters, digits, '_', '.', '-' "
                    "(it becomes a path)"
                )
        jpeg = self.dataset.kind is DatasetKind.JPEG
        if self.dataset.cost is not DatasetCost.STANDARD and not jpeg:
            out.append(
                f"{p}dataset.cost: got {self.dataset.cost.value!r} with dataset.kind "
                f"{self.dataset.kind.value!r}, expected 'standard' (cost variants are of JPEG sets)"
            )
        if self.dataset.classes > self.workload.classes and self.mode.loads:
            out.append(
                f"{p}dataset.classes: got {self.dataset.classes}, expected <= "
                f"workload.classes ({self.workload.classes}), the model's output size"
            )
        if self.layout.backend is Backend.NCCL and self.device is not DeviceKind.CUDA:
            out.append(f"{p}layout.backend: got 'nccl' with device 'cpu', expected 'gloo' on CPU")
        # `combined` on one rank is the single-process pipeline (DDP degenerates to no comm);
        # the modes whose point is the collective need a peer.
        if self.mode in {Mode.COMM, Mode.COMPUTE_COMM} and self.layout.world_size < 2:
            out.append(
                f"{p}mode: {self.mode.value!r} needs >= 2 ranks "
                f"(layout.nodes x layout.ranks_per_node = {self.layout.world_size})"
            )
        if self.mode.loads and self.loader.workers == 0:
            out.append(
                f"{p}loader.workers: got 0 with mode {self.mode.value!r}, expected >= 1 "
                "(loading in the main process has no worker to trace or pin)"
            )
        if self.loader.copy_ahead and self.loader.handoff is not Handoff.RING:
            out.append(
                f"{p}loader.copy_ahead: true with loader.handoff "
                f"{self.loader.handoff.value!r}, expected handoff 'ring' (the copy ahead is the "
                "ring's; torch's DataLoader has no side stream)"
            )
        out += self._trace_problems(p)
        out += self._runtime_problems(p)
        if not math.isfinite(self.workload.lr) or self.workload.lr <= 0:
            out.append(f"{p}workload.lr: got {self.workload.lr}, expected a finite number > 0")
        for key, (maximum, why) in UPPER_LIMITS.items():
            value = _leaf(self, key)
            # isinstance: pinning.launch_cores may be 'auto'.
            if isinstance(value, int) and value > maximum:
                out.append(f"{p}{key}: got {shown(value)}, expected <= {maximum} ({why})")
        if self.mode.loads and self.workload.batch_size > self.dataset.samples:
            # drop_last: the loader would yield no batch at all.
            out.append(
                f"{p}workload.batch_size: got {self.workload.batch_size}, more than "
                f"dataset.samples ({self.dataset.samples}); not one batch can be loaded"
            )
        return out

    def _range_problems(self, p: str) -> list[str]:
        """Integers below their minimum, and the seed above its maximum."""
        out: list[str] = []

        def positive(key: str, value: int, minimum: int = 1) -> None:
            if value < minimum:
                out.append(f"{p}{key}: got {shown(value)}, expected an integer >= {minimum}")

        positive("steps.measured", self.steps.measured)
        positive("steps.warmup", self.steps.warmup, 0)
        positive("workload.batch_size", self.workload.batch_size)
        positive("workload.image_size", self.workload.image_size, 8)
        positive("workload.classes", self.workload.classes, 2)
        positive("workload.seq_len", self.workload.seq_len, 8)
        positive("loader.workers", self.loader.workers, 0)
        positive("loader.prefetch_factor", self.loader.prefetch_factor)
        positive("loader.worker_nice", self.loader.worker_nice, 0)
        cores = self.pinning.launch_cores
        if isinstance(cores, int) and cores < 1:
            out.append(f"{p}pinning.launch_cores: got {cores}, expected 'auto' or an integer >= 1")
        positive("pinning.cpus", self.pinning.cpus, 0)
        positive("layout.nodes", self.layout.nodes)
        positive("layout.ranks_per_node", self.layout.ranks_per_node)
        positive("layout.bucket_cap_mb", self.layout.bucket_cap_mb)
        positive("dataset.samples", self.dataset.samples)
        positive("dataset.classes", self.dataset.classes, 2)
        positive("dataset.height", self.dataset.height, 8)
        positive("dataset.width", self.dataset.width, 8)
        positive("dataset.depth", self.dataset.depth, 1)
        positive("trace.cupti_steps", self.trace.cupti_steps)
        positive("dataset.seed", self.dataset.seed, 0)
        positive("seed", self.seed, 0)
        if self.seed > MAX_SEED:  # see MAX_SEED
            out.append(f"{p}seed: got {self.seed}, expected an integer <= {MAX_SEED} (2^31 - 1)")
        positive("repeat", self.repeat, 0)
        return out

    def _runtime_problems(self, p: str) -> list[str]:
        interval = self.runtime.switch_interval_ms
        if math.isfinite(interval) and (
            interval == 0 or MIN_SWITCH_INTERVAL_MS <= interval <= MAX_SWITCH_INTERVAL_MS
        ):
            return []
        return [
            f"{p}runtime.switch_interval_ms: got {interval}, expected 0 (CPython's own) "
            f"or a number of ms from {MIN_SWITCH_INTERVAL_MS:g} (CPython keeps whole "
            f"microseconds) to {MAX_SWITCH_INTERVAL_MS:g}"
        ]

    def _trace_problems(self, p: str) -> list[str]:
        """The tracing levels this run can have: CUPTI needs CUDA and takes one subscriber."""
        out: list[str] = []
        for key, on in (("cupti", self.trace.cupti), ("cuda_api", self.trace.cuda_api)):
            if on and self.device is not DeviceKind.CUDA:
                out.append(f"{p}trace.{key}: true needs device 'cuda'")
        if self.trace.cupti and self.trace.cuda_api:
            out.append(
                f"{p}trace.cuda_api: true with trace.cupti: true, expected at most one "
                "(CUPTI admits one subscriber per process; Kineto already records runtime calls)"
            )
        if self.trace.cuda_api_sched and not self.trace.cuda_api:
            out.append(
                f"{p}trace.cuda_api_sched: true with trace.cuda_api: false, expected "
                "trace.cuda_api: true (the evidence is taken in its callbacks)"
            )
        # Only when the window is on: with CUPTI off, `steps.measured: 1` must not fail on a
        # default the run never reads.
        if self.trace.cupti and self.trace.cupti_steps > self.steps.measured:
            out.append(
                f"{p}trace.cupti_steps: got {self.trace.cupti_steps}, expected <= "
                f"steps.measured ({self.steps.measured})"
            )
        return out


# Upper limits of a run. Past them a run cannot work on any machine this tool targets, or is a
# hazard: loader.workers forks that many processes per rank (100,000 is a fork bomb), and the
# data set sizes decide how much is generated and copied to every tier. The config schema
# states each as the key's `maximum` (tests/test_spec.py keeps them equal), so that `codl plan`
# names the key where it was written (`defaults.loader.workers`); this table also guards a spec
# given to `codl run` directly.
UPPER_LIMITS: dict[str, tuple[int, str]] = {
    "loader.workers": (MAX_LOADER_WORKERS, "processes forked per rank"),
    "loader.prefetch_factor": (64, "batches held in memory per worker"),
    "loader.worker_nice": (MAX_NICE, "Linux's lowest priority"),
    "workload.batch_size": (65_536, "samples per step per rank"),
    "workload.image_size": (4_096, "pixels per edge"),
    "workload.classes": (1_000_000, "outputs of the model head"),
    "workload.seq_len": (1_048_576, "tokens per sequence"),
    "dataset.samples": (10_000_000, "files generated and staged"),
    "dataset.classes": (100_000, "class folders generated"),
    "dataset.height": (8_192, "pixels"),
    "dataset.width": (8_192, "pixels"),
    "dataset.depth": (1_024, "voxels"),
    "dataset.seed": (2**63 - 1, "a 64-bit seed"),
    "steps.warmup": (1_000_000, "steps"),
    "steps.measured": (10_000_000, "steps"),
    "trace.cupti_steps": (10_000_000, "steps"),
    "layout.nodes": (4_096, "nodes"),
    "layout.ranks_per_node": (256, "processes per node"),
    "layout.bucket_cap_mb": (65_536, "MiB per gradient bucket"),
    "pinning.cpus": (65_536, "CPUs per rank"),
    "pinning.launch_cores": (65_536, "CPUs per rank"),
}


def _leaf(spec: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        spec = getattr(spec, part)
    return spec


def shown(value: Any) -> str:
    """A config value as a message shows it: ``repr``, except an integer too long to read (or
    past what Python will print: 4,300 digits), shown by its length."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        digits = math.floor(abs(value).bit_length() * math.log10(2)) + 1
        return f"{'a negative' if value < 0 else 'an'} integer of about {digits} digits"
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters)"


_T = TypeVar("_T")


def to_dict(value: Any) -> Any:
    """A spec dataclass (or an enum, or plain data) as JSON-ready plain data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    return value


# get_type_hints evaluates every annotation string anew; the spec classes never change, and a
# 1,000-run matrix parses 6,000 of them (benchmarks/dag_cost.py: 70 % of the plan's time).
_HINTS: dict[type, dict[str, Any]] = {}


def _type_hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def from_dict(cls: type[_T], data: Any, *, where: str = "") -> _T:
    """Build spec dataclass ``cls`` from plain data; raises ConfigError listing every problem
    with its key path (``where`` prefixes them). ``RunSpec.from_dict`` adds the semantic checks.
    """
    problems: list[str] = []
    built = _from_mapping(cls, data, where, problems)
    if problems or built is None:
        raise ConfigError(problems or [f"{where or '<root>'}: could not be built"])
    return built


def _from_mapping(cls: type[_T], data: Any, where: str, problems: list[str]) -> _T | None:
    """Build dataclass ``cls`` from plain data, collecting every problem with its key path."""
    if not isinstance(data, Mapping):
        problems.append(f"{where or '<root>'}: got {type(data).__name__}, expected a mapping")
        return None
    hints = _type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in data:
        if key not in fields:
            problems.append(
                f"{_join(where, str(key))}: unknown key, expected one of {sorted(fields)}"
                + did_you_mean(str(key), fields)
            )
    kwargs: dict[str, Any] = {}
    for name in fields:
        if name not in data:
            continue
        path = _join(where, name)
        value = data[name]
        hint = hints[name]
        converted = _convert(hint, value, path, problems)
        if converted is not _INVALID:
            kwargs[name] = converted
    try:
        return cls(**kwargs)
    except TypeError as exc:  # pragma: no cover - all keys were checked above
        problems.append(f"{where or '<root>'}: {exc}")
        return None


_INVALID = object()


def _convert(hint: Any, value: Any, path: str, problems: list[str]) -> Any:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        before = len(problems)
        built = _from_mapping(hint, value, path, problems)
        return _INVALID if built is None or len(problems) > before else built
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        allowed = [m.value for m in hint]
        if value in allowed:
            return hint(value)
        problems.append(
            f"{path}: got {value!r}, expected one of {allowed}" + did_you_mean(value, allowed)
        )
        return _INVALID
    if hint is bool:
        if isinstance(value, bool):
            return value
        problems.append(f"{path}: got {value!r}, expected true or false")
        return _INVALID
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        problems.append(f"{path}: got {shown(value)}, expected an integer")
        return _INVALID
    if hint is float:
        # NaN and infinity are floats, and pass every comparison a range check makes; an
        # integer past 1.8e308 has no float (float() raises OverflowError).
        if isinstance(value, int | float) and not isinstance(value, bool):
            if isinstance(value, float) and math.isfinite(value):
                return value
            if isinstance(value, int) and abs(value) <= sys.float_info.max:
                return float(value)
        problems.append(f"{path}: got {shown(value)}, expected a finite number")
        return _INVALID
    if hint is str:
        if isinstance(value, str):
            return value
        problems.append(f"{path}: got {value!r}, expected a string")
        return _INVALID
    if isinstance(hint, types.UnionType) or get_origin(hint) is Union:
        return _convert_union(get_args(hint), value, path, problems)
    if get_origin(hint) is Literal:
        if value in get_args(hint):
            return value
        problems.append(f"{path}: got {value!r}, expected one of {list(get_args(hint))}")
        return _INVALID
    raise TypeError(f"unsupported spec field type {hint!r} at {path}")  # pragma: no cover


def _convert_union(arms: tuple[Any, ...], value: Any, path: str, problems: list[str]) -> Any:
    """The first arm that takes ``value``; one problem naming every arm when none does."""
    wanted: list[str] = []
    for arm in arms:
        mine: list[str] = []
        converted = _convert(arm, value, path, mine)
        if converted is not _INVALID:
            return converted
        if get_origin(arm) is Literal:
            wanted.extend(repr(a) for a in get_args(arm))
        else:
            wanted.append("an integer" if arm is int else getattr(arm, "__name__", str(arm)))
    problems.append(f"{path}: got {value!r}, expected " + " or ".join(wanted))
    return _INVALID


def loads_json(text: str, *, source: str) -> Any:
    """JSON text as Python, refusing duplicate keys (``json`` keeps the last one silently, so a
    spec naming ``seed`` twice would run with whichever came last): one ConfigError listing
    every duplicate, or CodlError for text that is not JSON."""
    duplicates: list[str] = []

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                duplicates.append(
                    f"{source}: duplicate key {key!r} (values {seen[key]!r} and {value!r})"
                )
            seen[key] = value
        return seen

    try:
        data = json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as exc:
        raise CodlError(f"{source}: not valid JSON ({exc})") from None
    except ValueError:  # json's int() refuses more digits than sys.get_int_max_str_digits()
        raise CodlError(
            f"{source}: holds an integer of more than {sys.get_int_max_str_digits()} digits, "
            "expected a run spec"
        ) from None
    if duplicates:
        raise ConfigError(duplicates, source=source)
    return data


def did_you_mean(value: Any, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest choice to a misspelled ``value``, else ``""``."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def field_paths(cls: type[Any] = RunSpec, prefix: str = "") -> list[str]:
    """Every dotted leaf key of a spec class, e.g. ``loader.workers``; for messages and factors."""
    hints = typing.get_type_hints(cls)
    out: list[str] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        key = _join(prefix, f.name)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            out.extend(field_paths(hint, key))
        else:
            out.append(key)
    return out


def is_safe_name(name: str) -> bool:
    """Names that become paths or shell words: letters, digits, '_', '.', '-'; no leading dot."""
    return bool(SAFE_NAME.match(name))


#: The environment variable through which the workflow hands the frozen plan's hash to its
#: runs (codl.plan_registry): inherited by every job, never a rule parameter (a parameter's
#: change re-runs every run). Here, below the harness that records it and the plan that sets it.
PLAN_ENV: Final = "CODL_PLAN_SHA256"
#: The trace's root attribute holding it ("" where no plan was frozen).
PLAN_ATTR: Final = "plan_sha256"
