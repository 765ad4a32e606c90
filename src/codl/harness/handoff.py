"""The ring hand-off (``loader.handoff: ring``): the harness's face of ``codl.loader``'s ring.

The ring itself (workers forked from the rank collate straight into slots of one anonymous
shared mapping; the rank waits on a semaphore and copies a slot to the GPU on a stream of its
own) is ``codl.loader._ring``, the one implementation that ``codl.loader.DataLoader`` also
uses; why it exists is told there and in docs/loader.md. What the harness adds here:

- an endless sampler (``hdata.EndlessShuffle``): one iterator spans every step of a run, with
  no epoch boundary to drain (see ``EndlessShuffle`` for the stall that avoids);
- the harness's batches (``hdata.Batch``, collated by ``hdata.collate``), whose per-item and
  collate timing rows travel in the slot beside the inputs and targets;
- ``next()`` and ``to_device()`` apart, as the runner times them as two phases: ``next()``
  gives views of the slot, ``to_device`` copies them out and gives the slot back;
- with ``copy_ahead``, the copy of the next batch started one batch ahead, as
  ``codl.loader.DataLoader`` does on CUDA: once ``to_device`` has started batch N's copy, batch
  N+1 is taken if its worker has already filled it (never waiting for it) and its copy started
  on the ring's stream at once, so that it overlaps batch N's compute. ``next()`` then gives
  that batch (its inputs and targets already the copies) and ``to_device`` only makes the
  current stream wait for the copy. On the CPU the copy is made at once there (no overlap: the
  batches and their order are the same, which is what the tests check).

Batch k goes to worker k mod W, as torch's in-order DataLoader sends it, and workers are seeded
as torch seeds its own, so the batches equal torch's (tests/test_handoff.py compares them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from codl.errors import CodlError
from codl.harness import data as hdata
from codl.loader._ring import WORKER_NAME, LoaderWorkerError, Ring, RingSpec, Taken

__all__ = ["WORKER_NAME", "LoaderWorkerError", "RingLoader"]


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
    it, its pid, how it ended and the sample it was reading; the loader then stays failed.

    With ``copy_ahead`` the batch after the one ``to_device`` copies has its copy started there
    when it is already filled (see the module docstring); its inputs and targets are then the
    copies, to be used only through ``to_device``."""

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
        copy_ahead: bool = False,
    ) -> None:
        """``timeout`` is torch's DataLoader's: if positive, the seconds ``next()`` waits for a
        batch before it raises; 0 waits as long as the batch's worker lives."""
        if timeout < 0:
            raise LoaderWorkerError(f"RingLoader: timeout must be >= 0 seconds, got {timeout}")
        if workers < 1:
            raise LoaderWorkerError(
                f"loader.handoff 'ring' needs loader.workers >= 1, got {workers}"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.workers = workers
        self.depth = prefetch_factor
        self.generator = generator
        self.device = device if device is not None else torch.device("cpu")
        self.copy_ahead = copy_ahead
        self._spec = RingSpec(
            dataset=dataset,
            workers=workers,
            prefetch_factor=prefetch_factor,
            collate_fn=hdata.collate,
            worker_init_fn=worker_init_fn,
            page_lock=page_lock and self.device.type == "cuda",
            device=self.device,
            timeout=timeout,
        )
        self._ring: Ring | None = None
        self._batches: Iterator[list[int]] = iter(())
        self._taken: Taken | None = None  # the batch the last next() returned
        # copy_ahead: the next batch, its copy started (the batch, its copy event or None) ...
        self._ahead: tuple[hdata.Batch, Any] | None = None
        # ... and the one the last next() returned from there, until to_device.
        self._handed: tuple[hdata.Batch, Any] | None = None
        self.ahead_count = 0  # batches whose copy was started ahead (tests read it)
        self._pids: list[int] = []  # the last ring's workers, still named after close()

    def __iter__(self) -> RingLoader:
        if self._ring is not None:
            return self
        self._taken, self._ahead, self._handed = None, None, None
        # As torch's iterator does when it is made: the workers' base seed from the rank's
        # global generator (it advances it exactly as torch would).
        base_seed = int(torch.empty((), dtype=torch.int64).random_().item())
        self._batches = _batch_indices(len(self.dataset), self.generator, self.batch_size)
        first = next(self._batches)
        self._ring = ring = Ring(
            self._spec, base_seed=base_seed, probe_index=first[0], rows=self.batch_size
        )
        try:
            ring.submit(first)
            for _ in range(self.workers * self.depth - 1):
                ring.submit(next(self._batches))
        except BaseException:
            self.close()
            raise
        return self

    @property
    def _stream(self) -> Any:
        """The stream the copies run on (tests queue work on it)."""
        return self._ring.stream if self._ring is not None else None

    def __next__(self) -> hdata.Batch:
        ring = self._ring
        if ring is None:
            raise LoaderWorkerError("RingLoader: next() before iter()")
        if self._ahead is not None:
            # Its copy already started (copy_ahead): to_device only waits for it.
            self._handed, self._ahead = self._ahead, None
            ring.submit(next(self._batches))
            return self._handed[0]
        taken = ring.take()
        if taken is None:  # the sampler never ends: something is badly wrong
            raise LoaderWorkerError("RingLoader: no batch was asked of the workers")
        # torch's iterator asks for the next batch as it returns one.
        ring.submit(next(self._batches))
        self._taken = taken
        views = ring.views(taken)
        return hdata.Batch(
            inputs=views.inputs,
            targets=views.targets,
            items=views.items.copy(),
            collate=views.collate.copy(),
        )

    def to_device(
        self, batch: hdata.Batch, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The last batch's inputs and targets on ``device``; its slot goes back to its worker
        once the copy has read it (on CPU: a copy at once, as the slot is reused). With
        ``copy_ahead``, the next batch's copy is then started if it is already filled."""
        taken, ring, handed = self._taken, self._ring, self._handed
        if ring is None or (taken is None and handed is None):
            raise LoaderWorkerError("RingLoader: to_device() without a batch taken")
        self._taken, self._handed = None, None
        if handed is not None:
            out, copied = handed
        else:
            assert taken is not None
            out, copied = ring.copy_out(taken, device)
        if self.copy_ahead:
            self._start_ahead(ring, device)
        x, y = out.inputs, out.targets
        if copied is not None:
            current = torch.cuda.current_stream(device)
            current.wait_event(copied)
            # Made on the ring's stream, used on the rank's: not to be reused before that is done.
            x.record_stream(current)
            y.record_stream(current)
        return x, y

    def _start_ahead(self, ring: Ring, device: torch.device) -> None:
        """The next batch, if its worker has filled it: taken (never waiting) and its copy
        started, queued on the ring's stream behind the one just started."""
        if self._ahead is not None or not ring.outstanding:
            return
        try:
            taken = ring.take(block=False)
        except CodlError:
            # The ring keeps the failure: next()'s take raises it, in the data-wait phase.
            return
        if taken is None:
            return
        views = ring.views(taken)
        # The timing rows out of the slot first: it goes back to its worker once copied.
        items, collate = views.items.copy(), views.collate.copy()
        out, copied = ring.copy_out(taken, device)
        batch = hdata.Batch(inputs=out.inputs, targets=out.targets, items=items, collate=collate)
        self._ahead = (batch, copied)
        self.ahead_count += 1

    @property
    def page_locked(self) -> bool:
        """Whether the ring is registered with CUDA now (from iter() to close())."""
        return self._ring is not None and self._ring.page_locked

    def worker_pids(self) -> list[int]:
        return self._ring.worker_pids() if self._ring is not None else self._pids

    def close(self) -> None:
        """Stop the workers and unmap the ring; a later ``iter()`` starts a new one. Safe to
        call twice and after a partial start."""
        ring, self._ring, self._taken = self._ring, None, None
        # A batch copied ahead is dropped: its copy's event is waited for by ring.close().
        self._ahead, self._handed = None, None
        if ring is not None:
            self._pids = ring.worker_pids()
            ring.close()
