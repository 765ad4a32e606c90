"""The ring hand-off (``loader.handoff: ring``): batches reach the rank with no Python work in it
beyond a semaphore wait and one copy.

Why: with torch's DataLoader and pinned memory the rank's launch threads wait for the GIL. On
one H200 (docs/results-gil.md) py-spy found the pin-memory thread holding it in 36 % of the
samples in which any thread held it, half of those in the ``munmap`` of a batch's shared storage
after its pinned copy; per batch the rank's Python receives and unpickles the batch, maps its
storages, allocates page-locked memory, copies, and unmaps. Here:

- the workers, forked from the rank as torch's are, decode and collate straight into a ring of
  slots in one anonymous shared mapping made once before they start. It has no name in /dev/shm,
  so it ends with the last process that maps it, however that process ends, and the workers die
  with the rank (``PR_SET_PDEATHSIG``);
- the rank page-locks the ring once, after forking the workers (``cudaHostRegister``, when
  ``loader.pin_memory`` on CUDA), and per batch waits on a POSIX semaphore (the GIL released
  while it blocks), copies the slot to the GPU on a stream of its own, and gives the slot back
  once the copy's event has completed:
  no pin-memory thread, no unpickling, no mmap, munmap or page-locking per batch.

Batch k goes to worker k mod W, as torch's in-order DataLoader assigns it; each worker walks its
own copy of the endless sampler and keeps its batches, so no index list is sent either. Workers
are seeded as torch seeds its own (torch's generator: a base seed drawn from the rank's global
generator when the iterator is made, plus the worker id; then the same ``worker_init_fn``), so
the batches equal torch's (tests/test_handoff.py compares them). The semaphores are unlinked at
creation (multiprocessing's fork context does so), so they leave nothing behind either.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import mmap
import multiprocessing
import os
import random
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import numpy as np
import torch

from codl.errors import CodlError, DataSetError
from codl.harness import data as hdata
from codl.trace.clock import now_ns

_PAGE = mmap.PAGESIZE
_ALIGN = 64
# Slot header, int64 fields: the batch index it holds, its status, the error text's length.
_HEADER = 3
_BATCH, _STATUS, _ERR_LEN = range(_HEADER)
_OK, _FAILED = 0, 1
_ERR_BYTES = 4096
# How often a waiting side looks whether its peer is still there.
_POLL_S = 0.2
# How long close() lets the workers end by themselves (all together) before it kills them.
_JOIN_S = 5.0
# Control words at the start of the mapping: the stop flag, then per worker what it is doing
# (the batch it fills and the sample it reads, or _IDLE), read by the rank to say what a worker
# was doing when it died, failed or took too long.
_STOP = 0
_PROGRESS = 2  # words per worker: batch, sample
_IDLE, _STARTING = -1, -2
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
# The name torch gives its workers' threads; codl.pinning recognises loader workers by it.
WORKER_NAME = b"pt_data_worker"


class LoaderWorkerError(CodlError):
    """A ring worker died or failed with an error that is not the data set's."""


@dataclasses.dataclass(frozen=True)
class _Field:
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int  # from the slot's start, bytes

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _itemsize(self.dtype)


@dataclasses.dataclass(frozen=True)
class SlotLayout:
    """Where a batch's parts lie in one slot; learnt from one sample of the data set."""

    inputs: _Field
    targets: _Field
    items: _Field
    collate: _Field
    header: _Field
    error: _Field
    size: int  # bytes, a whole number of pages

    @classmethod
    def for_sample(cls, sample: Sequence[Any], batch_size: int) -> SlotLayout:
        x, y = sample[0], sample[1]
        if not isinstance(x, torch.Tensor):
            raise LoaderWorkerError(f"a sample's input is {type(x).__name__}, expected a tensor")
        y_shape, y_dtype = (
            (tuple(y.shape), y.dtype) if isinstance(y, torch.Tensor) else ((), torch.long)
        )
        offset = 0
        fields: dict[str, _Field] = {}
        for name, shape, dtype in (
            ("header", (_HEADER,), torch.int64),
            ("error", (_ERR_BYTES,), torch.uint8),
            ("items", (batch_size, len(hdata.ITEM_COLUMNS)), torch.int64),
            ("collate", (len(hdata.COLLATE_COLUMNS),), torch.int64),
            ("targets", (batch_size, *y_shape), y_dtype),
            ("inputs", (batch_size, *tuple(x.shape)), x.dtype),
        ):
            fields[name] = _Field(shape, dtype, offset)
            offset = _round_up(offset + fields[name].nbytes, _ALIGN)
        return cls(**fields, size=_round_up(offset, _PAGE))


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class _Slot:
    """Tensor views of one slot (no copy): made once, in each process that maps the ring."""

    def __init__(self, buf: mmap.mmap, start: int, layout: SlotLayout) -> None:
        def view(f: _Field) -> torch.Tensor:
            flat = torch.frombuffer(buf, dtype=torch.uint8, count=f.nbytes, offset=start + f.offset)
            return flat.view(f.dtype).view(f.shape)

        self.header = view(layout.header)
        self.error = view(layout.error)
        self.items = view(layout.items)
        self.collate = view(layout.collate)
        self.targets = view(layout.targets)
        self.inputs = view(layout.inputs)


@dataclasses.dataclass
class _Shared:
    """What the rank and its workers share: the mapping, its layout and the semaphores."""

    buf: mmap.mmap
    layout: SlotLayout
    workers: int
    depth: int  # slots per worker: the prefetch factor
    ready: list[Any]  # per worker: slots filled, not yet taken
    free: list[Any]  # per worker: slots the worker may fill
    parent: int

    @staticmethod
    def control_bytes(workers: int) -> int:
        return _round_up(8 * (1 + _PROGRESS * workers), _PAGE)

    def slot_index(self, batch: int) -> int:
        worker, nth = batch % self.workers, batch // self.workers
        return worker * self.depth + nth % self.depth

    def slot(self, index: int) -> _Slot:
        start = self.control_bytes(self.workers) + index * self.layout.size
        return _Slot(self.buf, start, self.layout)

    @property
    def control(self) -> torch.Tensor:
        return torch.frombuffer(
            self.buf, dtype=torch.int64, count=1 + _PROGRESS * self.workers, offset=0
        )

    def progress(self, worker: int) -> torch.Tensor:
        """The worker's [batch, sample]: what it fills and reads now."""
        return self.control[1 + _PROGRESS * worker : 1 + _PROGRESS * (worker + 1)]


def _batch_indices(size: int, generator: torch.Generator, batch_size: int) -> Iterator[list[int]]:
    """torch's batches over ``hdata.EndlessShuffle``: each batch the next ``batch_size`` indices
    (BatchSampler with drop_last; an endless sampler never leaves a short batch)."""
    batch: list[int] = []
    for index in hdata.EndlessShuffle(size, generator):
        batch.append(index)
        if len(batch) == batch_size:
            yield batch
            batch = []


class RingLoader:
    """The ring hand-off's loader: ``iter()`` starts the workers, ``next()`` gives a
    ``hdata.Batch`` whose inputs and targets are views of a slot, ``to_device`` copies them out
    and gives the slot back, ``close()`` stops everything (also on any error).

    A worker that dies, fails or (with ``timeout``) takes too long is a one-line error naming
    it, its pid, how it ended and the sample it was reading; the loader then stays failed."""

    def __init__(
        self,
        dataset: Any,
        *,
        batch_size: int,
        workers: int,
        prefetch_factor: int,
        generator: torch.Generator,
        worker_init_fn: Callable[[int], None] | None = None,
        page_lock: bool = False,
        device: torch.device | None = None,
        timeout: float = 0.0,
    ) -> None:
        """``timeout`` is torch's DataLoader's: if positive, the seconds ``next()`` waits for a
        batch before it raises; 0 waits as long as the batch's worker lives."""
        if timeout < 0:
            raise LoaderWorkerError(f"RingLoader: timeout must be >= 0 seconds, got {timeout}")
        if workers < 1:
            raise LoaderWorkerError(
                f"loader.handoff 'ring' needs loader.workers >= 1, got {workers}"
            )
        if "fork" not in multiprocessing.get_all_start_methods():
            raise LoaderWorkerError(
                "loader.handoff 'ring' needs the fork start method (workers inherit the ring), "
                f"which {sys.platform} lacks; use loader.handoff: torch"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.workers = workers
        self.depth = prefetch_factor
        self.generator = generator
        self.worker_init_fn = worker_init_fn
        self.device = device if device is not None else torch.device("cpu")
        self.page_lock = page_lock and self.device.type == "cuda"
        self.timeout = timeout
        self._shared: _Shared | None = None
        self._slots: list[_Slot] = []
        self._procs: list[Any] = []
        self._next = 0
        self._taken: int | None = None  # the worker whose slot the last next() returned
        self._pending: deque[tuple[Any, int]] = deque()  # (copy event, worker) not yet freed
        self._registered = 0
        self._stream: Any = None
        self._held = [0] * workers  # per worker: its slots taken by next(), not given back
        # The first failure: every later next() raises it again (the worker is gone; a later
        # wait would only report that, and hide why).
        self._error: CodlError | None = None

    # -- starting ----------------------------------------------------------------------------
    def __iter__(self) -> RingLoader:
        if self._shared is not None:
            return self
        self._next, self._taken, self._error = 0, None, None
        self._held = [0] * self.workers
        # As torch's iterator does when it is made: the workers' base seed from the rank's
        # global generator (it advances it exactly as torch would).
        base_seed = int(torch.empty((), dtype=torch.int64).random_().item())
        layout = SlotLayout.for_sample(self._probe(), self.batch_size)
        n_slots = self.workers * self.depth
        ctx = multiprocessing.get_context("fork")
        # An anonymous shared mapping: inherited by the forked workers, named nowhere.
        control = _Shared.control_bytes(self.workers)
        buf = mmap.mmap(-1, control + n_slots * layout.size, flags=mmap.MAP_SHARED)
        self._shared = shared = _Shared(
            buf=buf,
            layout=layout,
            workers=self.workers,
            depth=self.depth,
            ready=[ctx.Semaphore(0) for _ in range(self.workers)],
            free=[ctx.Semaphore(self.depth) for _ in range(self.workers)],
            parent=os.getpid(),
        )
        self._slots = [shared.slot(i) for i in range(n_slots)]
        shared.control[1:] = _STARTING
        try:
            state = self.generator.get_state()
            for wid in range(self.workers):
                proc = ctx.Process(
                    target=_worker_main,
                    args=(
                        shared,
                        wid,
                        self.dataset,
                        base_seed,
                        self.worker_init_fn,
                        state,
                        self.batch_size,
                    ),
                    daemon=True,
                    name=f"codl-ring-worker-{wid}",
                )
                proc.start()
                self._procs.append(proc)
            # Page-locked after the workers are forked: a driver may mark registered pages
            # not to be inherited (MADV_DONTFORK), and the workers must have the ring mapped.
            if self.page_lock:
                self._register(buf)
                self._stream = torch.cuda.Stream(self.device)
        except BaseException:
            self.close()
            raise
        return self

    def _probe(self) -> Any:
        """One sample, to learn the slot layout, with every generator it draws from put back:
        the rank's state stays what torch's path would leave."""
        py_state, np_state = random.getstate(), np.random.get_state()
        try:
            with torch.random.fork_rng(devices=[]):
                return self.dataset[0]
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)

    def _register(self, buf: mmap.mmap) -> None:
        cudart = torch.cuda.cudart()
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        # cudaHostRegisterPortable (1), as torch's own registration uses.
        err = cudart.cudaHostRegister(ptr, len(buf), 1)
        if int(err) != 0:
            raise LoaderWorkerError(f"cudaHostRegister of the {len(buf)}-byte ring failed: {err}")
        self._registered = ptr

    # -- per batch ---------------------------------------------------------------------------
    def __next__(self) -> hdata.Batch:
        shared = self._shared
        if shared is None:
            raise LoaderWorkerError("RingLoader: next() before iter()")
        if self._error is not None:
            raise self._error
        self._free_copied()
        k = self._next
        worker = k % self.workers
        try:
            self._await(worker, k)
            slot = self._slots[shared.slot_index(k)]
            status, index = int(slot.header[_STATUS]), int(slot.header[_BATCH])
            if status != _OK:
                raise self._failure(worker, slot)
            if index != k:
                raise LoaderWorkerError(
                    f"{self._who(worker)} filled batch {index}, expected batch {k}"
                )
        except CodlError as exc:
            self._error = exc
            raise
        self._next += 1
        self._held[worker] += 1
        self._taken = worker
        return hdata.Batch(
            inputs=slot.inputs,
            targets=slot.targets,
            items=slot.items.numpy().copy(),
            collate=slot.collate.numpy().copy(),
        )

    def to_device(
        self, batch: hdata.Batch, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The last batch's inputs and targets on ``device``; its slot goes back to its worker
        once the copy has read it (on CPU: a copy at once, as the slot is reused)."""
        worker = self._taken
        if worker is None:
            raise LoaderWorkerError("RingLoader: to_device() without a batch taken")
        self._taken = None
        if device.type != "cuda":
            x, y = batch.inputs.clone(), batch.targets.clone()
            self._give_back(worker)
            return x, y
        stream = self._stream if self._stream is not None else torch.cuda.current_stream(device)
        with torch.cuda.stream(stream):
            x = batch.inputs.to(device, non_blocking=True)
            y = batch.targets.to(device, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(stream)
        current = torch.cuda.current_stream(device)
        if stream is not current:
            current.wait_event(copied)
            x.record_stream(current)
            y.record_stream(current)
        self._pending.append((copied, worker))
        return x, y

    def _free_copied(self) -> None:
        while self._pending and self._pending[0][0].query():
            self._give_back(self._pending.popleft()[1])

    def _give_back(self, worker: int) -> None:
        if self._shared is not None:
            self._held[worker] -= 1
            self._shared.free[worker].release()

    def _await(self, worker: int, k: int) -> None:
        """Wait for batch k, ready in its slot; an error, not a hang, if it cannot come."""
        shared = cast(_Shared, self._shared)
        if self._held[worker] >= self.depth:
            self._reclaim(worker, k)
        proc = self._procs[worker]
        ready = shared.ready[worker]
        start = time.monotonic()
        wait = min(_POLL_S, self.timeout) if self.timeout else _POLL_S
        while not ready.acquire(timeout=wait):
            if not proc.is_alive():
                # It may have handed over its slot (a failure, most likely) just before it ended.
                if ready.acquire(block=False):
                    return
                doing = self._doing(worker)
                raise LoaderWorkerError(
                    f"{self._who(worker)} {_exit_text(proc.exitcode)}{doing}"
                    f"{',' if doing else ''} before it delivered batch {k}"
                )
            if self.timeout and time.monotonic() - start >= self.timeout:
                doing = self._doing(worker).replace(" while ", " ", 1)
                raise LoaderWorkerError(
                    f"{self._who(worker)} did not deliver batch {k} within the loader's timeout "
                    f"of {self.timeout:g} s" + (f"; it is still{doing}" if doing else "")
                )

    def _reclaim(self, worker: int, k: int) -> None:
        """Every slot of the worker is with the rank, so the worker cannot fill batch k: give
        back the oldest one whose copy is in flight (waiting for it), or fail if the caller
        holds them all (batches taken by next() and never passed to to_device())."""
        while self._held[worker] >= self.depth and any(w == worker for _, w in self._pending):
            event, owner = self._pending.popleft()
            event.synchronize()
            self._give_back(owner)
        if self._held[worker] >= self.depth:
            raise LoaderWorkerError(
                f"RingLoader: the rank holds all {self.depth} slots of loader worker {worker} "
                f"(batches taken by next() and never passed to to_device()), so batch {k} "
                "can never come"
            )

    def _who(self, worker: int) -> str:
        return f"loader worker {worker} (pid {self._procs[worker].pid})"

    def _doing(self, worker: int) -> str:
        """What the worker was doing when it last said, as a phrase after a verb ('' if idle)."""
        batch, sample = (int(v) for v in cast(_Shared, self._shared).progress(worker))
        if batch == _STARTING:
            return " while starting (worker_init_fn)"
        if sample >= 0:
            return f" while reading sample {sample} of batch {batch}"
        if batch >= 0:
            return f" while filling batch {batch}"
        return ""

    def _failure(self, worker: int, slot: _Slot) -> CodlError:
        n = int(slot.header[_ERR_LEN])
        kind, _, text = bytes(slot.error[:n].numpy()).decode(errors="replace").partition("\n")
        message = f"{self._who(worker)} failed{self._doing(worker)}: {text}"
        if kind == DataSetError.__name__:
            return DataSetError(message)
        return LoaderWorkerError(message)

    # -- stopping ----------------------------------------------------------------------------
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def close(self) -> None:
        """Stop the workers (a flag, then each woken), wait for the copies still reading the
        ring, unregister and unmap it. Safe to call twice and after a partial start."""
        shared = self._shared
        if shared is None:
            return
        shared.control[_STOP] = 1
        for sem in shared.free:
            for _ in range(self.depth):
                sem.release()
        # One deadline for all: a worker stuck in the data set is killed after it, not after
        # every other worker's wait as well.
        deadline = time.monotonic() + _JOIN_S
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(timeout=_JOIN_S)
        for event, _ in self._pending:
            event.synchronize()
        self._pending.clear()
        if self._registered:
            torch.cuda.cudart().cudaHostUnregister(self._registered)
            self._registered = 0
        self._slots = []
        self._procs = []
        self._shared = None
        # The views made here are gone; a batch the caller still holds keeps the mapping alive
        # until it is dropped (mmap refuses to close under an exported buffer).
        with contextlib.suppress(BufferError):
            shared.buf.close()


def _exit_text(code: int | None) -> str:
    if code is None:
        return "is gone"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


# -- the worker ----------------------------------------------------------------------------------
def _worker_main(
    shared: _Shared,
    wid: int,
    dataset: Any,
    base_seed: int,
    init_fn: Callable[[int], None] | None,
    generator_state: torch.Tensor,
    batch_size: int,
) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    # Die with the rank, whatever ends it: nothing then maps the ring, and it is gone.
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != shared.parent:
        os._exit(0)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(WORKER_NAME))
    torch.set_num_threads(1)
    # torch's worker seeding, then the run's worker_init_fn (which may reseed random/numpy).
    random.seed(base_seed + wid)
    torch.manual_seed(base_seed + wid)
    hdata.set_worker_id(wid)
    slots = {i: shared.slot(i) for i in range(wid * shared.depth, (wid + 1) * shared.depth)}
    progress = shared.progress(wid)
    mine = wid  # the next batch this worker delivers
    holding = False  # a slot taken and not yet handed over
    try:
        if init_fn is not None:
            init_fn(wid)
        progress[:] = _IDLE
        generator = torch.Generator()
        generator.set_state(generator_state)
        for k, indices in enumerate(_batch_indices(len(dataset), generator, batch_size)):
            if k % shared.workers != wid:
                continue
            if not _take_free(shared, wid):
                return
            holding = True
            progress[0] = k
            _fill(slots[shared.slot_index(k)], k, indices, dataset, shared.layout, progress)
            progress[0] = _IDLE
            holding = False
            shared.ready[wid].release()
            mine = k + shared.workers
    except BaseException as exc:  # the rank reports it; a worker must not die silently
        if holding or _take_free(shared, wid):
            _fail(slots[shared.slot_index(mine)], mine, exc)
            shared.ready[wid].release()
    finally:
        os._exit(0)  # no atexit, no finalizers of the rank's objects run in a fork


def _take_free(shared: _Shared, wid: int) -> bool:
    """Wait for a slot of this worker; False when the rank stops or is gone."""
    while not shared.free[wid].acquire(timeout=_POLL_S):
        if os.getppid() != shared.parent:
            return False
    return not int(shared.control[_STOP])


def _fill(
    slot: _Slot,
    k: int,
    indices: list[int],
    dataset: Any,
    layout: SlotLayout,
    progress: torch.Tensor,
) -> None:
    samples = []
    for i in indices:
        progress[1] = i  # left as it is if the read fails or ends the worker
        samples.append(dataset[i])
    progress[1] = _IDLE
    t0 = now_ns()
    for b, (x, y, row) in enumerate(samples):
        if tuple(x.shape) != layout.inputs.shape[1:] or x.dtype != layout.inputs.dtype:
            raise LoaderWorkerError(
                f"sample {indices[b]}: input {x.dtype}{list(x.shape)}, the ring's slots hold "
                f"{layout.inputs.dtype}{list(layout.inputs.shape[1:])} (every sample of a "
                "batch must have one shape)"
            )
        slot.inputs[b].copy_(x)
        slot.targets[b] = y
        slot.items[b] = torch.from_numpy(row)
    t1 = now_ns()
    slot.collate.copy_(torch.from_numpy(hdata.collate_row(t0, t1)))
    slot.header[_BATCH] = k
    slot.header[_STATUS] = _OK


def _fail(slot: _Slot, k: int, exc: BaseException) -> None:
    # One line: the rank's error is printed as one, and a multi-line message (or a note)
    # would put its last line, not the worker's, last.
    lines = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if isinstance(exc, DataSetError):
        text = f"{DataSetError.__name__}\n{lines}"
    else:
        text = f"{type(exc).__name__}\n{type(exc).__name__}" + (f": {lines}" if lines else "")
    raw = text.encode()[:_ERR_BYTES]
    slot.error[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    slot.header[_ERR_LEN] = len(raw)
    slot.header[_BATCH] = k
    slot.header[_STATUS] = _FAILED
