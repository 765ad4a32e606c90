"""The ring: loader workers collate straight into slots of one anonymous shared mapping.

Why: with torch's DataLoader and pinned memory the rank's launch threads wait for the GIL. On
one H200 (docs/results-gil.md) py-spy found the pin-memory thread holding it in 36 % of the
samples in which any thread held it, half of those in the ``munmap`` of a batch's shared storage
after its pinned copy (pytorch/pytorch#77139). Per batch the rank's Python receives and
unpickles the batch, maps its storages, allocates page-locked memory, copies, and unmaps. Here:

- the workers, forked from the rank as torch's are, fetch and collate a batch and write it into
  a slot of one anonymous shared mapping made once before they start. It has no name in
  /dev/shm, so it ends with the last process that maps it, however that process ends, and the
  workers die with the rank (``PR_SET_PDEATHSIG``);
- the rank draws every batch's indices from the batch sampler itself, at the moments torch's
  iterator draws them, and writes them into the slot the batch will fill: batch k of an epoch
  goes to worker k mod W, as torch's in-order DataLoader sends it;
- the rank page-locks the ring once, after forking the workers (``cudaHostRegister``), and per
  batch waits on a POSIX semaphore (the GIL released while it blocks), copies the slot to the
  GPU on a stream of its own, and gives the slot back once the copy's event has completed:
  no pin-memory thread, no unpickling, no mmap, munmap or page-locking per batch.

A slot's layout (every leaf's dtype and largest shape) is learnt once, from the collate function
applied to one sample repeated to a full batch; a later batch may only be shorter along a leaf's
first dimension (a last partial batch). Workers are seeded as torch seeds its own. The
semaphores are unlinked at creation (multiprocessing's fork context does so).

This module must not import ``codl.harness`` (``codl.loader`` is the public, harness-free
package; tests/test_loader.py checks it in a fresh interpreter).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import mmap
import multiprocessing
import os
import pickle
import random
import select
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.random  # imported before any fork: a child importing it can race the parent's threads
import torch
from torch.utils.data import default_collate

from codl.errors import CodlError, DataSetError

_PAGE = mmap.PAGESIZE
_ALIGN = 64
# Slot header, int64 words: the batch it holds (its index in the epoch), its status, the error
# text's length, the number of indices the rank asked for.
_HEADER = 4
_BATCH, _STATUS, _ERR_LEN, _COUNT = range(_HEADER)
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
    """A loader worker died, failed or hung with an error that is not the data set's."""


class BatchLayoutError(CodlError, ValueError):
    """A batch cannot go through the ring's fixed slots (a string leaf, a shape that grew)."""


# -- the layout of one slot ------------------------------------------------------------------
# A batch is a tree: dicts, named tuples, tuples and lists of leaves (tensors, numpy arrays,
# Python numbers). The tree is kept as nested tuples, compared whole against every later batch.
_Tree = tuple[Any, ...]
_LEAF: _Tree = ("leaf",)


@dataclasses.dataclass(frozen=True)
class _Leaf:
    path: str  # how the user names it: batch['label'], batch[1], batch.inputs
    kind: str  # tensor | numpy | int | float | bool
    shape: tuple[int, ...]  # the largest: the probe's
    dtype: torch.dtype
    offset: int  # from the slot's start, bytes

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _itemsize(self.dtype)

    def describe(self, dtype: torch.dtype, shape: Sequence[int]) -> str:
        return f"{str(dtype).removeprefix('torch.')}{list(shape)}"


def _flatten(obj: Any, path: str, out: list[tuple[str, Any]]) -> _Tree:
    """The batch's tree, its leaves appended to ``out`` as (path, leaf) in order."""
    if isinstance(obj, torch.Tensor | np.ndarray | bool | int | float | np.generic):
        out.append((path, obj))
        return _LEAF
    if isinstance(obj, Mapping):
        keys = tuple(obj)
        kids = tuple(_flatten(obj[k], f"{path}[{k!r}]", out) for k in keys)
        return ("map", type(obj), keys, kids)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        fields = cast(Sequence[str], obj._fields)
        kids = tuple(_flatten(v, f"{path}.{f}", out) for f, v in zip(fields, obj, strict=True))
        return ("named", type(obj), kids)
    if isinstance(obj, list | tuple):
        return (
            "seq",
            type(obj),
            tuple(_flatten(v, f"{path}[{i}]", out) for i, v in enumerate(obj)),
        )
    raise BatchLayoutError(
        f"{path} is a {type(obj).__name__}: codl.loader's slots hold tensors, numpy arrays and "
        "numbers (make it one in the collate_fn, or leave it out of the sample)"
    )


def _flatten_plain(sample: Any, out: list[tuple[str, Any]]) -> _Tree | None:
    """The tree default_collate makes of batches of this sample (tuples become lists), if its
    leaves are CPU tensors and Python numbers only; else None."""
    if isinstance(sample, torch.Tensor):
        if sample.device.type != "cpu":
            return None
        out.append(("", sample))
        return _LEAF
    if isinstance(sample, bool | int | float):
        out.append(("", sample))
        return _LEAF
    if type(sample) is dict:
        kids = [_flatten_plain(sample[k], out) for k in sample]
        return None if None in kids else ("map", dict, tuple(sample), tuple(kids))
    if isinstance(sample, tuple) and hasattr(sample, "_fields"):
        kids = [_flatten_plain(v, out) for v in sample]
        return None if None in kids else ("named", type(sample), tuple(kids))
    if type(sample) in (list, tuple):
        kids = [_flatten_plain(v, out) for v in sample]
        return None if None in kids else ("seq", list, tuple(kids))
    return None


def _unflatten(tree: _Tree, leaves: Iterable[Any]) -> Any:
    it = iter(leaves)

    def build(node: _Tree) -> Any:
        if node is _LEAF or node == _LEAF:
            return next(it)
        if node[0] == "map":
            _, cls, keys, kids = node
            values = [build(k) for k in kids]
            return (
                dict(zip(keys, values, strict=True))
                if cls is dict
                else cls(zip(keys, values, strict=True))
            )
        if node[0] == "named":
            return node[1](*(build(k) for k in node[2]))
        _, cls, kids = node
        return cls(build(k) for k in kids)

    return build(tree)


def _as_tensor(path: str, leaf: Any) -> tuple[str, torch.Tensor]:
    """The leaf's kind and a CPU tensor of its values (a view where it can be)."""
    if isinstance(leaf, torch.Tensor):
        if leaf.device.type != "cpu":
            raise BatchLayoutError(
                f"{path} is on {leaf.device}: loader workers must return CPU tensors"
            )
        return "tensor", leaf
    if isinstance(leaf, np.ndarray | np.generic):
        arr = np.asarray(leaf)
        try:
            return "numpy", torch.from_numpy(np.ascontiguousarray(arr))
        except TypeError:
            raise BatchLayoutError(
                f"{path} is a numpy array of {arr.dtype}: the slots hold numeric arrays only"
            ) from None
    # bool before int: bool is an int.
    for kind, cls, dtype in (("bool", bool, torch.bool), ("int", int, torch.int64)):
        if isinstance(leaf, cls):
            return kind, torch.tensor(leaf, dtype=dtype)
    return "float", torch.tensor(leaf, dtype=torch.float64)


@dataclasses.dataclass(frozen=True)
class SlotLayout:
    """Where a batch's parts lie in one slot; learnt from a probe batch."""

    tree: _Tree
    leaves: tuple[_Leaf, ...]
    rows: int  # the most indices a batch may have
    indices: int  # offsets, bytes
    dims: int
    error: int
    size: int  # bytes, a whole number of pages

    @classmethod
    def for_batch(cls, batch: Any, rows: int) -> SlotLayout:
        found: list[tuple[str, Any]] = []
        tree = _flatten(batch, "batch", found)
        offset = _round_up(8 * _HEADER, _ALIGN)
        indices = offset
        offset = _round_up(offset + 8 * rows, _ALIGN)
        dims = offset
        offset = _round_up(offset + 8 * max(1, len(found)), _ALIGN)
        error = offset
        offset = _round_up(offset + _ERR_BYTES, _ALIGN)
        leaves = []
        for path, value in found:
            kind, t = _as_tensor(path, value)
            leaves.append(_Leaf(path, kind, tuple(t.shape), t.dtype, offset))
            offset = _round_up(offset + leaves[-1].nbytes, _ALIGN)
        return cls(tree, tuple(leaves), rows, indices, dims, error, _round_up(offset, _PAGE))


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class _Slot:
    """Tensor views of one slot (no copy): made once, in each process that maps the ring."""

    def __init__(self, buf: mmap.mmap, start: int, layout: SlotLayout) -> None:
        def view(offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            n = int(np.prod(shape, dtype=np.int64)) * _itemsize(dtype)
            flat = torch.frombuffer(buf, dtype=torch.uint8, count=n, offset=start + offset)
            return flat.view(dtype).view(shape)

        self.layout = layout
        self.header = view(0, (_HEADER,), torch.int64)
        self.indices = view(layout.indices, (layout.rows,), torch.int64)
        self.dims = view(layout.dims, (max(1, len(layout.leaves)),), torch.int64)
        self.error = view(layout.error, (_ERR_BYTES,), torch.uint8)
        self.leaves = [view(leaf.offset, leaf.shape, leaf.dtype) for leaf in layout.leaves]

    def write(self, batch: Any, k: int) -> None:
        """Put a collated batch into the slot; a one-line error naming a leaf that does not fit."""
        layout = self.layout
        found: list[tuple[str, Any]] = []
        tree = _flatten(batch, "batch", found)
        if tree != layout.tree:
            raise BatchLayoutError(
                f"batch {k} is not shaped like the first batch (its keys, fields or lengths "
                "differ): codl.loader's slots are laid out once, from the first batch"
            )
        for j, ((path, value), leaf) in enumerate(zip(found, layout.leaves, strict=True)):
            kind, t = _as_tensor(path, value)
            shape = tuple(t.shape)
            fits = kind == leaf.kind and t.dtype == leaf.dtype and len(shape) == len(leaf.shape)
            fits = fits and (
                not shape or (shape[1:] == leaf.shape[1:] and shape[0] <= leaf.shape[0])
            )
            if not fits:
                raise BatchLayoutError(
                    f"{path}: {leaf.describe(t.dtype, shape)} in batch {k}, expected "
                    f"{leaf.describe(leaf.dtype, leaf.shape)} or fewer rows (the slots are laid "
                    "out from the first batch; only the first dimension may shrink, as in a last "
                    "partial batch: pad in the collate_fn, or use torch's DataLoader)"
                )
            view = self.leaves[j]
            if shape:
                view[: shape[0]].copy_(t)
                self.dims[j] = shape[0]
            else:
                view.copy_(t)

    def stack_into(self, samples: list[Any]) -> bool:
        """torch's default_collate, stacked straight into the slot; False (nothing written that
        matters) where the samples are not plain tensors and numbers of the slot's layout, for
        default_collate itself to handle or to refuse. In a worker, default_collate would
        otherwise put each batch in a new shared-memory segment, only to be copied here."""
        columns: list[list[Any]] = []
        tree = None
        for sample in samples:
            found: list[tuple[str, Any]] = []
            t = _flatten_plain(sample, found)
            if t is None or (tree is not None and t != tree):
                return False
            tree = t
            if not columns:
                columns = [[] for _ in found]
            for column, (_, value) in zip(columns, found, strict=True):
                column.append(value)
        if tree != self.layout.tree:
            return False
        n = len(samples)
        for j, (column, leaf) in enumerate(zip(columns, self.layout.leaves, strict=True)):
            first = column[0]
            if isinstance(first, torch.Tensor):
                shape = (n, *first.shape)
                if (
                    leaf.kind != "tensor"
                    or leaf.dtype != first.dtype
                    or len(shape) != len(leaf.shape)
                    or shape[1:] != leaf.shape[1:]
                    or n > leaf.shape[0]
                    or any(
                        not isinstance(v, torch.Tensor) or v.shape != first.shape for v in column
                    )
                ):
                    return False
                torch.stack(column, out=self.leaves[j][:n])
            else:
                try:
                    # default_collate's dtypes: float64 for floats, torch's inference otherwise.
                    values = torch.tensor(
                        column, dtype=torch.float64 if isinstance(first, float) else None
                    )
                except (TypeError, ValueError, RuntimeError):
                    return False
                if leaf.dtype != values.dtype or leaf.shape[1:] or n > leaf.shape[0]:
                    return False
                self.leaves[j][:n] = values
            self.dims[j] = n
        return True

    def read(self) -> tuple[list[torch.Tensor], list[str]]:
        """Views of the batch's leaves, each cut to the rows the worker wrote, and their kinds."""
        views = [v[: int(self.dims[j])] if v.dim() else v for j, v in enumerate(self.leaves)]
        return views, [leaf.kind for leaf in self.layout.leaves]


def _leaf_out(kind: str, t: torch.Tensor) -> Any:
    if kind == "tensor":
        return t
    if kind == "numpy":
        return t.numpy()
    return t.item()


@dataclasses.dataclass
class _Shared:
    """What the rank and its workers share: the mapping, its layout and the semaphores."""

    buf: mmap.mmap
    layout: SlotLayout
    workers: int
    depth: int  # slots per worker: the prefetch factor
    todo: list[Any]  # per worker: slots whose indices the rank wrote, not yet taken up
    ready: list[Any]  # per worker: slots filled, not yet taken
    parent: int

    @staticmethod
    def control_bytes(workers: int) -> int:
        return _round_up(8 * (1 + _PROGRESS * workers), _PAGE)

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


class Taken(NamedTuple):
    """A batch the rank took from its slot: views of the slot until it is given back."""

    k: int  # its index in the epoch
    worker: int
    leaves: list[torch.Tensor]
    kinds: list[str]


@dataclasses.dataclass(frozen=True)
class RingSpec:
    """How a ring is made: everything but the batches' indices, which the caller submits."""

    dataset: Any
    workers: int
    prefetch_factor: int
    collate_fn: Callable[[list[Any]], Any]
    worker_init_fn: Callable[[int], None] | None = None
    page_lock: bool = False
    device: torch.device | None = None
    timeout: float = 0.0


class Ring:
    """One ring and its workers: ``submit`` a batch's indices (in the epoch's order), ``take``
    it when filled, ``copy_out`` (or ``give_back``) to return the slot, ``close`` at the end.

    A worker that dies, fails or (with ``timeout``) takes too long is a one-line error naming
    it, its pid, how it ended and the sample it was reading; the ring then stays failed."""

    def __init__(self, spec: RingSpec, *, base_seed: int, probe_index: int, rows: int) -> None:
        """Learns the layout from ``collate_fn([dataset[probe_index]] * rows)`` (in the rank,
        every random generator put back), makes the mapping and forks the workers."""
        if spec.timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds, got {spec.timeout}")
        if spec.workers < 1:
            raise ValueError(f"the ring needs workers >= 1, got {spec.workers}")
        if "fork" not in multiprocessing.get_all_start_methods():
            raise LoaderWorkerError(
                "codl.loader's workers need the fork start method (they inherit the ring), "
                f"which {sys.platform} lacks; use torch.utils.data.DataLoader"
            )
        self.spec = spec
        self._owner = os.getpid()
        self._closed = True  # until the mapping exists: close() has nothing to undo
        self.workers = spec.workers
        self.depth = spec.prefetch_factor
        self.timeout = spec.timeout
        device = spec.device if spec.device is not None else torch.device("cpu")
        self.device = device
        self._procs: list[Any] = []
        self._pending: deque[tuple[Any, int]] = deque()  # (copy event, worker) not yet freed
        self._registered = 0
        self.stream: Any = None
        # Per worker: requests queued (slot busy), written, batches taken, slots given back.
        self._queued: list[deque[tuple[int, list[int]]]] = [deque() for _ in range(self.workers)]
        self._written = [0] * self.workers
        self._taken = [0] * self.workers
        self._returned = [0] * self.workers
        self._expect: deque[tuple[int, int]] = deque()  # (k, worker) submitted, not taken
        self._epoch_k = 0  # the next batch index of this epoch to submit
        # The first failure: every later take() raises it again (the worker is gone; a later
        # wait would only report that, and hide why).
        self._error: CodlError | None = None
        layout = _probe_layout(spec, probe_index, rows, base_seed)
        ctx = multiprocessing.get_context("fork")
        control = _Shared.control_bytes(self.workers)
        # An anonymous shared mapping: inherited by the forked workers, named nowhere.
        buf = mmap.mmap(
            -1, control + self.workers * self.depth * layout.size, flags=mmap.MAP_SHARED
        )
        self._shared = shared = _Shared(
            buf=buf,
            layout=layout,
            workers=self.workers,
            depth=self.depth,
            todo=[ctx.Semaphore(0) for _ in range(self.workers)],
            ready=[ctx.Semaphore(0) for _ in range(self.workers)],
            parent=os.getpid(),
        )
        self._closed = False
        self._slots = [shared.slot(i) for i in range(self.workers * self.depth)]
        shared.control[1:] = _STARTING
        try:
            for wid in range(self.workers):
                proc = ctx.Process(
                    target=_worker_main,
                    args=(
                        shared,
                        wid,
                        spec.dataset,
                        spec.collate_fn,
                        base_seed,
                        spec.worker_init_fn,
                    ),
                    daemon=True,
                    name=f"codl-loader-worker-{wid}",
                )
                proc.start()
                self._procs.append(proc)
            if device.type == "cuda":
                # Page-locked after the workers are forked: a driver may mark registered pages
                # not to be inherited (MADV_DONTFORK), and the workers must have the ring mapped.
                if spec.page_lock:
                    self._register(buf)
                self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        except BaseException:
            self.close()
            raise

    @property
    def layout(self) -> SlotLayout:
        return self._shared.layout

    def _register(self, buf: mmap.mmap) -> None:
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        # cudaHostRegisterPortable (1), as torch's own registration uses.
        err = cudart.cudaHostRegister(ptr, len(buf), 1)
        if int(err) != 0:
            raise LoaderWorkerError(f"cudaHostRegister of the {len(buf)}-byte ring failed: {err}")
        self._registered = ptr

    # -- the rank's side, per batch ------------------------------------------------------------
    def new_epoch(self) -> None:
        """Batch 0 of the next epoch goes to worker 0 again (torch resets its worker cycle);
        call it with nothing submitted and not taken (``drain``)."""
        self._epoch_k = 0

    def submit(self, indices: Sequence[int]) -> None:
        """The next batch of the epoch: its indices go to worker k mod W, into its next slot as
        soon as one is free."""
        k = self._epoch_k
        if len(indices) > self.layout.rows or not indices:
            raise BatchLayoutError(
                f"the batch sampler gave batch {k} {len(indices)} indices; the slots hold 1 to "
                f"{self.layout.rows} (the first batch's size)"
            )
        try:
            idx = [int(i) for i in indices]
        except (TypeError, ValueError):
            raise TypeError(
                f"the batch sampler gave batch {k} the indices {list(indices)[:4]}...: "
                "codl.loader sends integer indices to its workers"
            ) from None
        worker = k % self.workers
        self._epoch_k += 1
        self._queued[worker].append((k, idx))
        self._expect.append((k, worker))
        self._dispatch(worker)

    def _dispatch(self, worker: int) -> None:
        queue = self._queued[worker]
        while queue and self._written[worker] - self._returned[worker] < self.depth:
            k, idx = queue.popleft()
            slot = self._slots[worker * self.depth + self._written[worker] % self.depth]
            slot.indices[: len(idx)] = torch.tensor(idx, dtype=torch.int64)
            slot.header[_COUNT] = len(idx)
            slot.header[_BATCH] = k
            slot.header[_STATUS] = _OK
            self._written[worker] += 1
            self._shared.todo[worker].release()

    @property
    def outstanding(self) -> int:
        """Batches submitted and not yet taken."""
        return len(self._expect)

    def take(self, *, block: bool = True) -> Taken | None:
        """The next batch of the epoch (views of its slot); None if nothing was submitted, or
        (``block=False``) if it is not ready yet."""
        if self._closed:
            raise LoaderWorkerError("codl.loader: the ring was closed")
        if self._error is not None:
            raise self._error
        self._free_copied()
        if not self._expect:
            return None
        k, worker = self._expect[0]
        try:
            if self._queued[worker] and self._queued[worker][0][0] == k:
                if not block:
                    return None
                self._reclaim(worker, k)
            if not self._await(worker, k, block):
                return None
            slot = self._slots[worker * self.depth + self._taken[worker] % self.depth]
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
        self._expect.popleft()
        self._taken[worker] += 1
        leaves, kinds = slot.read()
        return Taken(k, worker, leaves, kinds)

    def unflatten(self, leaves: Sequence[Any]) -> Any:
        return _unflatten(self.layout.tree, leaves)

    def views(self, taken: Taken) -> Any:
        """The batch as the collate function made it, its parts views of the slot."""
        return self.unflatten(
            [_leaf_out(k, t) for k, t in zip(taken.kinds, taken.leaves, strict=True)]
        )

    def copy_out(self, taken: Taken, device: torch.device, *, pin: bool = False) -> tuple[Any, Any]:
        """The batch with its tensors on ``device`` and its slot on the way back: on CUDA the
        copy runs on the ring's stream and the slot goes back once its event has completed
        (the event is returned: the consumer's stream must wait for it); on the CPU a copy at
        once (page-locked with ``pin``), as the slot is reused, and no event."""
        if device.type != "cuda":
            out = []
            for kind, t in zip(taken.kinds, taken.leaves, strict=True):
                if kind == "tensor":
                    c = torch.empty(t.shape, dtype=t.dtype, pin_memory=pin)
                    out.append(c.copy_(t))
                else:
                    out.append(_leaf_out(kind, t.clone()))
            self.give_back(taken.worker)
            return self.unflatten(out), None
        stream = self.stream if self.stream is not None else torch.cuda.current_stream(device)
        out = []
        with torch.cuda.stream(stream):
            for kind, t in zip(taken.kinds, taken.leaves, strict=True):
                if kind == "tensor":
                    out.append(t.to(device, non_blocking=True))
                else:
                    out.append(_leaf_out(kind, t.clone()))
        copied = torch.cuda.Event()  # type: ignore[no-untyped-call]
        copied.record(stream)
        self._pending.append((copied, taken.worker))
        return self.unflatten(out), copied

    def give_back(self, worker: int) -> None:
        if self._closed:
            return
        self._returned[worker] += 1
        self._dispatch(worker)

    def _free_copied(self) -> None:
        while self._pending and self._pending[0][0].query():
            self.give_back(self._pending.popleft()[1])

    def _await(self, worker: int, k: int, block: bool) -> bool:
        """Wait for batch k, ready in its slot; an error, not a hang, if it cannot come."""
        proc = self._procs[worker]
        ready = self._shared.ready[worker]
        if not block:
            return bool(ready.acquire(block=False))
        start = time.monotonic()
        wait = min(_POLL_S, self.timeout) if self.timeout else _POLL_S
        while not ready.acquire(timeout=wait):
            if not proc.is_alive():
                # It may have handed over its slot (a failure, most likely) just before it ended.
                if ready.acquire(block=False):
                    return True
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
        return True

    def _reclaim(self, worker: int, k: int) -> None:
        """Every slot of the worker is with the rank, so batch k's indices are not even sent:
        give back the oldest slot whose copy is in flight (waiting for it), or fail if the
        caller holds them all (batches taken and never copied out nor given back)."""
        while self._queued[worker] and any(w == worker for _, w in self._pending):
            event, owner = self._pending.popleft()
            event.synchronize()
            self.give_back(owner)
        if self._queued[worker] and self._queued[worker][0][0] == k:
            raise LoaderWorkerError(
                f"codl.loader: the rank holds all {self.depth} slots of loader worker {worker} "
                f"(batches taken by next() and never passed to to_device()), so batch {k} "
                "can never come"
            )

    def drain(self) -> None:
        """Take and give back every batch submitted and not taken (the rest of an epoch left
        unfinished), so that the next epoch starts with every slot free."""
        while self._expect:
            taken = self.take()
            if taken is not None:
                self.give_back(taken.worker)
        for event, owner in self._pending:
            event.synchronize()
            self.give_back(owner)
        self._pending.clear()

    def _who(self, worker: int) -> str:
        return f"loader worker {worker} (pid {self._procs[worker].pid})"

    def _doing(self, worker: int) -> str:
        """What the worker was doing when it last said, as a phrase after a verb ('' if idle)."""
        batch, sample = (int(v) for v in self._shared.progress(worker))
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
        if kind == BatchLayoutError.__name__:
            return BatchLayoutError(message)
        return LoaderWorkerError(message)

    # -- stopping ----------------------------------------------------------------------------
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def close(self) -> None:
        """Stop the workers (a flag, then each woken), wait for the copies still reading the
        ring, unregister and unmap it. Safe to call twice and after a partial start; a no-op in
        a forked child (a worker's garbage collector may find a loader of the rank)."""
        if self._closed or os.getpid() != self._owner:
            return
        self._closed = True
        shared = self._shared
        shared.control[_STOP] = 1
        for sem in shared.todo:
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
            torch.cuda.cudart().cudaHostUnregister(self._registered)  # type: ignore[no-untyped-call]
            self._registered = 0
        self._slots = []
        # The views made here are gone; a batch the caller still holds keeps the mapping alive
        # until it is dropped (mmap refuses to close under an exported buffer).
        with contextlib.suppress(BufferError):
            shared.buf.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def page_locked(self) -> bool:
        """Whether the ring is registered with CUDA now (from the start to close())."""
        return bool(self._registered)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "is gone"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


# -- the layout probe ----------------------------------------------------------------------------
def _probe_layout(spec: RingSpec, index: int, rows: int, base_seed: int) -> SlotLayout:
    """The slots' layout, from ``collate_fn([dataset[index]] * rows)`` run in a forked child
    that is set up as worker 0 is: the rank reads no sample (its generators, open files and
    ``get_worker_info()`` stay as with torch's DataLoader). The layout comes back pickled, as
    torch's workers send whole batches."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        os.close(r)
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        payload: tuple[str, Any]
        try:
            torch.set_num_threads(1)
            _seed_as_torch(base_seed, 0, spec.workers, spec.dataset)
            if spec.worker_init_fn is not None:
                spec.worker_init_fn(0)
            batch = spec.collate_fn([spec.dataset[index]] * rows)
            payload = ("ok", SlotLayout.for_batch(batch, rows))
            data = pickle.dumps(payload)
        except BaseException as exc:
            data = pickle.dumps(("error", _error_text(exc)))
        with os.fdopen(w, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(w)
    who = f"the loader's layout probe (pid {pid}, reading sample {index} as worker 0 would)"
    with os.fdopen(r, "rb") as f:
        if spec.timeout and not select.select([f], [], [], spec.timeout)[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise LoaderWorkerError(
                f"{who} did not lay out the slots within the loader's timeout of {spec.timeout:g} s"
            )
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        code = os.waitstatus_to_exitcode(status)
        raise LoaderWorkerError(f"{who} {_exit_text(code)} before it laid out the slots")
    status_word, value = pickle.loads(data)
    if status_word == "ok":
        return cast(SlotLayout, value)
    kind, _, text = str(value).partition("\n")
    cls = {"DataSetError": DataSetError, "BatchLayoutError": BatchLayoutError}
    raise cls.get(kind, LoaderWorkerError)(text if kind in cls else f"{who} failed: {text}")


# -- the worker ----------------------------------------------------------------------------------
def _seed_as_torch(base_seed: int, wid: int, workers: int, dataset: Any) -> None:
    """torch's worker seeding (torch.utils.data._utils.worker._worker_loop), and its worker
    info, so that ``get_worker_info()`` answers in a ring worker as in torch's."""
    from torch.utils.data._utils import worker as tw

    seed = base_seed + wid
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(tw._generate_state(base_seed, wid))  # type: ignore[no-untyped-call]
    # torch keeps it in a module global; there is no public setter.
    tw._worker_info = tw.WorkerInfo(id=wid, num_workers=workers, seed=seed, dataset=dataset)


def _worker_main(
    shared: _Shared,
    wid: int,
    dataset: Any,
    collate_fn: Callable[[list[Any]], Any],
    base_seed: int,
    init_fn: Callable[[int], None] | None,
) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    # Die with the rank, whatever ends it: nothing then maps the ring, and it is gone.
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != shared.parent:
        os._exit(0)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(WORKER_NAME))
    torch.set_num_threads(1)
    _seed_as_torch(base_seed, wid, shared.workers, dataset)
    slots = [shared.slot(i) for i in range(wid * shared.depth, (wid + 1) * shared.depth)]
    progress = shared.progress(wid)
    n = 0  # requests taken up
    holding: _Slot | None = None  # a slot taken up and not yet handed over
    try:
        if init_fn is not None:
            init_fn(wid)
        progress[:] = _IDLE
        while _take_todo(shared, wid):
            holding = slots[n % shared.depth]
            n += 1
            _fill(holding, dataset, collate_fn, progress)
            holding = None
            shared.ready[wid].release()
    except BaseException as exc:  # the rank reports it; a worker must not die silently
        if holding is None and _take_todo(shared, wid):
            holding = slots[n % shared.depth]
        if holding is not None:
            _fail(holding, exc)
            shared.ready[wid].release()
    finally:
        os._exit(0)  # no atexit, no finalizers of the rank's objects run in a fork


def _take_todo(shared: _Shared, wid: int) -> bool:
    """Wait for a slot to fill; False when the rank stops or is gone."""
    while not shared.todo[wid].acquire(timeout=_POLL_S):
        if os.getppid() != shared.parent:
            return False
    return not int(shared.control[_STOP])


def _fill(
    slot: _Slot, dataset: Any, collate_fn: Callable[[list[Any]], Any], progress: torch.Tensor
) -> None:
    k = int(slot.header[_BATCH])
    progress[0] = k
    samples = []
    for i in slot.indices[: int(slot.header[_COUNT])].tolist():
        progress[1] = i  # left as it is if the read fails or ends the worker
        samples.append(dataset[i])
    progress[1] = _IDLE
    if collate_fn is not default_collate or not slot.stack_into(samples):
        slot.write(collate_fn(samples), k)
    slot.header[_STATUS] = _OK
    progress[0] = _IDLE


def _error_text(exc: BaseException) -> str:
    """The kind the rank re-raises, a newline, and the error as one line."""
    # One line: the rank's error is printed as one, and a multi-line message (or a note)
    # would put its last line, not the worker's, last.
    lines = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if isinstance(exc, DataSetError | BatchLayoutError):
        kind = DataSetError if isinstance(exc, DataSetError) else BatchLayoutError
        return f"{kind.__name__}\n{lines}"
    return f"{type(exc).__name__}\n{type(exc).__name__}" + (f": {lines}" if lines else "")


def _fail(slot: _Slot, exc: BaseException) -> None:
    raw = _error_text(exc).encode()[:_ERR_BYTES]
    slot.error[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    slot.header[_ERR_LEN] = len(raw)
    slot.header[_STATUS] = _FAILED
