"""`cuda_api` level: per-call latency of CUDA runtime API calls, the cheap way.

Kineto (the `cupti` level) gets runtime API calls from CUPTI's *activity* API together with
every kernel and every PyTorch operator: on an H200 that made ResNet-50 1.33x slower and its
cost lingers. Per-call latency needs far less: CUPTI's *callback* API, subscribed to a handful
of runtime functions (kernel launches, memcpy/memset, synchronisations) and to driver-level
launches issued outside the runtime (cuDNN/cuBLAS), with a C callback that takes two
CLOCK_MONOTONIC readings and claims a buffer slot with one atomic add (``cuda_api_shim.c``).
No kernel records, no activity buffers, no operator hooks, on every step of the run.
``benchmarks/launch_api_cost.py`` measures this against Kineto; docs/results-h200.md has the
figures.

The shim is compiled on first use with the system C compiler (``$CC``, else ``cc``) into a
cache keyed by its source hash; CUPTI itself is the ``libcupti`` that PyTorch already loaded.
Rows land in ``events/cuda`` as Kineto's runtime rows do (kind ``runtime`` or ``sync``, OS
thread id, CUPTI correlation id), so every analysis of runtime API latency reads either level.
CUPTI admits one callback subscriber per process: this level and `cupti` exclude each other.

``trace.cuda_api_sched`` adds scheduling evidence to every call (``events/cuda_sched``): the
calling thread's CPU time and its voluntary/involuntary context switches between entry and exit,
and its CPU at both ends. ``codl.analysis.calls`` turns those into preempted / blocked / on-CPU
shares of each slow call. It costs a getrusage at entry and at exit of every call, plus the
thread CPU clock after a context switch (all outside the latency stamps; see the shim).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from codl.errors import CodlError
from codl.trace.kineto import Spans, StepIndex
from codl.trace.schema import Table, empty_columns

DOMAIN_DRIVER = 1
DOMAIN_RUNTIME = 2
# Runtime calls that queue or wait for GPU work: what a launch thread spends its time in.
RUNTIME_PREFIXES = ("cudaLaunch", "cudaMemcpy", "cudaMemset")
# Libraries that link the runtime statically (cuDNN, cuBLAS) launch through the driver; the
# shim drops driver launches issued from inside a runtime call, which are the same launch.
DRIVER_FUNCTIONS = frozenset({"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel"})
MAX_CBID = 4096  # far above the largest runtime/driver callback id of CUDA 13
DEFAULT_CAPACITY = 1 << 22  # 4 Mi calls, 128 MiB of address space touched only as used
RECORD = np.dtype(
    [
        ("start_ns", "<i8"),
        ("end_ns", "<i8"),
        ("tid", "<i4"),
        ("domain", "<u4"),
        ("cbid", "<u4"),
        ("correlation", "<u4"),
        ("thread_cpu_ns", "<i8"),
        ("voluntary", "<i4"),
        ("involuntary", "<i4"),
        ("cpu_entry", "<i2"),
        ("cpu_exit", "<i2"),
        ("pad_", "<i4"),
    ]
)
SCHED_TABLE = Table.CUDA_SCHED
_VERSION_SUFFIX = re.compile(r"_v\d+$")


def wanted(domain: int, name: str) -> bool:
    if domain == DOMAIN_RUNTIME:
        return name.startswith(RUNTIME_PREFIXES) or name.endswith("Synchronize")
    return name in DRIVER_FUNCTIONS


def _cache_dir() -> Path:
    root = os.environ.get("CODL_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")
    return Path(root) / "codl" if root else Path.home() / ".cache" / "codl"


def build_shim(cache: Path | None = None) -> Path:
    """Compile cuda_api_shim.c once per source version; concurrent ranks may race safely."""
    source = resources.files("codl.trace").joinpath("cuda_api_shim.c").read_bytes()
    cache = cache or _cache_dir()
    lib = cache / f"cuda_api_shim-{hashlib.sha256(source).hexdigest()[:12]}.so"
    if lib.exists():
        return lib
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise CodlError(
            f"trace.cuda_api needs a C compiler to build its CUPTI callback shim: {cc!r} is not "
            "on PATH (set CC, or switch trace.cuda_api off)"
        )
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        src = Path(tmp) / "shim.c"
        src.write_bytes(source)
        out = Path(tmp) / "shim.so"
        proc = subprocess.run(
            [cc, "-O2", "-std=c11", "-shared", "-fPIC", "-o", str(out), str(src)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise CodlError(f"building the CUPTI callback shim with {cc} failed:\n{proc.stderr}")
        os.replace(out, lib)  # atomic: a rank never loads a half-written library
    return lib


def _loaded_cupti() -> str | None:
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.rstrip().split(maxsplit=5)[-1]
            if "/libcupti.so" in path:
                return path
    return None


def find_cupti() -> str:
    """The libcupti to subscribe through: $CODL_LIBCUPTI, else PyTorch's own copy when it is
    loaded (a second copy would register with the driver twice), the nvidia wheels, the linker."""
    for candidate in (os.environ.get("CODL_LIBCUPTI"), _loaded_cupti()):
        if candidate:
            return candidate
    spec = importlib.util.find_spec("nvidia")
    for root in list(spec.submodule_search_locations or []) if spec else []:
        hits = sorted(Path(root).glob("*/lib/libcupti.so*"))
        if hits:
            return str(hits[-1])
    found = ctypes.util.find_library("cupti")
    if found is None:
        raise CodlError(
            "trace.cuda_api needs libcupti (nvidia-cuda-cupti wheel or the CUDA toolkit's "
            "extras/CUPTI); none found: set CODL_LIBCUPTI to its path"
        )
    return found


class _Cupti:
    """The few CUPTI entry points this level uses, through ctypes."""

    def __init__(self, path: str) -> None:
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise CodlError(f"cannot load libcupti {path}: {exc}") from exc
        self.path = path
        self.lib = lib
        lib.cuptiSubscribe.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.cuptiUnsubscribe.argtypes = [ctypes.c_void_p]
        lib.cuptiEnableCallback.argtypes = [
            ctypes.c_uint32,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_uint32,
        ]
        lib.cuptiGetCallbackName.argtypes = [
            ctypes.c_int,
            ctypes.c_uint32,
            ctypes.POINTER(ctypes.c_char_p),
        ]
        lib.cuptiGetResultString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    def check(self, code: int, what: str) -> None:
        if code != 0:
            msg = ctypes.c_char_p()
            self.lib.cuptiGetResultString(code, ctypes.byref(msg))
            text = msg.value.decode() if msg.value else f"CUPTI error {code}"
            raise CodlError(f"{what} failed: {text} ({self.path})")

    def callback_names(self, domain: int) -> dict[int, str]:
        out: dict[int, str] = {}
        name = ctypes.c_char_p()
        for cbid in range(1, MAX_CBID):
            if self.lib.cuptiGetCallbackName(domain, cbid, ctypes.byref(name)) == 0 and name.value:
                out[cbid] = _VERSION_SUFFIX.sub("", name.value.decode())
        return out


class ApiTracer:
    """Subscribe, record every wanted call on every thread of this process, read it back.

    ``sched=True`` also records each call's scheduling evidence (``events/cuda_sched``)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, *, sched: bool = False) -> None:
        self.shim = ctypes.CDLL(str(build_shim()))
        self.shim.codl_init.argtypes = [ctypes.c_uint64]
        self.shim.codl_arm.argtypes = [ctypes.c_int]
        self.shim.codl_set_sched.argtypes = [ctypes.c_int]
        for fn in ("codl_claimed", "codl_written", "codl_record_size"):
            getattr(self.shim, fn).restype = ctypes.c_uint64
        self.shim.codl_records.restype = ctypes.c_void_p
        if self.shim.codl_record_size() != RECORD.itemsize:
            raise CodlError("CUPTI callback shim and codl disagree on the record layout")
        if self.shim.codl_init(capacity) != 0:
            raise CodlError(f"cannot allocate {capacity} CUDA API records")
        self.shim.codl_set_sched(int(sched))
        self.sched = sched
        self.capacity = capacity
        self.cupti = _Cupti(find_cupti())
        self.names: dict[tuple[int, int], str] = {}
        self.handle = ctypes.c_void_p()
        self.active = False
        self.armed_at = 0

    def start(self, *, arm: bool = True) -> None:
        """Subscribe and enable the wanted callbacks; ``arm=False`` leaves recording off (the
        callback returns at once: what remains is CUPTI's own cost of calling it)."""
        callback = ctypes.cast(self.shim.codl_cupti_callback, ctypes.c_void_p)
        code = self.cupti.lib.cuptiSubscribe(ctypes.byref(self.handle), callback, None)
        if code != 0:
            self.cupti.check(
                code,
                "cuptiSubscribe for trace.cuda_api (CUPTI takes one subscriber per process: "
                "Kineto keeps its own for the life of the process once torch.profiler has run "
                "in it; Nsight Systems/Compute hold one too)",
            )
        self.active = True
        for domain in (DOMAIN_RUNTIME, DOMAIN_DRIVER):
            for cbid, name in self.cupti.callback_names(domain).items():
                if wanted(domain, name):
                    self.names[(domain, cbid)] = name
                    self.cupti.check(
                        self.cupti.lib.cuptiEnableCallback(1, self.handle, domain, cbid),
                        f"cuptiEnableCallback({name})",
                    )
        self.armed_at = time.monotonic_ns()
        if arm:
            self.shim.codl_arm(1)

    def stop(self) -> None:
        if not self.active:
            return
        self.shim.codl_arm(0)
        self.cupti.check(self.cupti.lib.cuptiUnsubscribe(self.handle), "cuptiUnsubscribe")
        self.active = False

    def records(self) -> np.ndarray[Any, np.dtype[Any]]:
        """The calls recorded so far (a copy); waits briefly for callbacks still writing."""
        claimed = int(self.shim.codl_claimed())
        n = min(claimed, self.capacity)
        deadline = time.monotonic() + 1.0
        while int(self.shim.codl_written()) < n and time.monotonic() < deadline:
            time.sleep(0.001)
        n = min(n, int(self.shim.codl_written()))
        if n == 0:
            return np.zeros(0, dtype=RECORD)
        buf = (ctypes.c_char * (n * RECORD.itemsize)).from_address(self.shim.codl_records())
        return np.frombuffer(bytes(buf), dtype=RECORD)

    def dropped(self) -> int:
        return max(0, int(self.shim.codl_claimed()) - self.capacity)

    def close(self) -> None:
        self.stop()
        self.shim.codl_free()


def _kept(rec: np.ndarray[Any, np.dtype[Any]], armed_at: int) -> np.ndarray[Any, np.dtype[Any]]:
    # A call already under way when recording began has an exit but no entry stamp.
    return rec[(rec["start_ns"] >= armed_at) & (rec["start_ns"] <= rec["end_ns"])]


def to_rows(
    rec: np.ndarray[Any, np.dtype[Any]],
    names: dict[tuple[int, int], str],
    spans: Spans,
    *,
    armed_at: int = 0,
) -> dict[str, Any]:
    """Shim records -> events/cuda columns (already on the run's monotonic clock)."""
    index = StepIndex(spans)
    cols = empty_columns(Table.CUDA)
    rec = _kept(rec, armed_at)
    if rec.size == 0:
        return cols
    start = rec["start_ns"].astype(np.int64)
    keys = zip(rec["domain"].tolist(), rec["cbid"].tolist(), strict=True)
    name = [names.get((d, c), f"cbid{c}") for d, c in keys]
    cols["rank"] = [index.rank] * rec.size
    cols["step"] = index.steps_of(start).tolist()
    cols["kind"] = ["sync" if n.endswith("Synchronize") else "runtime" for n in name]
    cols["name"] = name
    cols["tid"] = rec["tid"].astype(np.int64).tolist()
    cols["stream"] = [-1] * rec.size
    cols["correlation"] = rec["correlation"].astype(np.int64).tolist()
    cols["start_ns"] = start.tolist()
    cols["end_ns"] = rec["end_ns"].astype(np.int64).tolist()
    return cols


def sched_rows(
    rec: np.ndarray[Any, np.dtype[Any]], rank: int, *, armed_at: int = 0
) -> dict[str, Any]:
    """Shim records -> events/cuda_sched columns, row for row with ``to_rows``' output."""
    cols = empty_columns(SCHED_TABLE)
    rec = _kept(rec, armed_at)
    n = rec.size
    cols["rank"] = [rank] * n
    for name in cols:
        if name != "rank":  # every other column is the record field of the same name
            cols[name] = rec[name].astype(np.int64).tolist()
    return cols


def collect_tables(
    tracer: ApiTracer, spans: Spans
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Stop, read back, convert: ``{"events/cuda": ..., "events/cuda_sched": ...}`` (the latter
    only with scheduling evidence on) and the trace attributes of the level."""
    tracer.stop()
    rec = tracer.records()
    rows = to_rows(rec, tracer.names, spans, armed_at=tracer.armed_at)
    tables: dict[str, dict[str, Any]] = {Table.CUDA: rows}
    if tracer.sched:
        tables[SCHED_TABLE] = sched_rows(rec, StepIndex(spans).rank, armed_at=tracer.armed_at)
    attrs: dict[str, Any] = {
        "cuda_api": "on",
        "cuda_api_sched": "on" if tracer.sched else "off",
        "cuda_api_calls": len(rows["step"]),
        "cuda_api_dropped": tracer.dropped(),
        "cuda_api_functions": sorted(set(tracer.names.values())),
        "cuda_api_libcupti": tracer.cupti.path,
    }
    return tables, attrs


def collect(tracer: ApiTracer, spans: Spans) -> tuple[dict[str, Any], dict[str, Any]]:
    """``collect_tables`` for callers that want events/cuda only."""
    tables, attrs = collect_tables(tracer, spans)
    return tables[Table.CUDA], attrs
