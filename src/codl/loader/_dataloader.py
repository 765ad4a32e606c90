"""``codl.loader.DataLoader``: torch's DataLoader arguments and batches, through the ring."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import torch
import torch.utils.data as tud

from codl.loader._ring import Ring, RingSpec, Taken

T_co = TypeVar("T_co", covariant=True)
_DEFAULT_PREFETCH = 2  # torch's, with workers


class DataLoader(Generic[T_co]):
    """A drop-in for ``torch.utils.data.DataLoader`` over map-style data sets whose workers hand
    batches over through one shared ring of slots instead of pickled shared-memory tensors.

    Same arguments, same batches in the same order for the same seed (samplers, the generator,
    worker seeds, ``worker_init_fn``, ``get_worker_info()``). Added: ``device``, where batches
    are copied one batch ahead on a stream of the loader's, from the page-locked ring when
    ``pin_memory``. Without ``device`` each batch is copied out of its slot into memory of its
    own (page-locked with ``pin_memory``), so it is the caller's to keep, as with torch.

    Refused, with a one-line error naming the argument or the batch's field: iterable-style
    data sets, ``batch_size=None``, a start method other than ``fork``, a batch whose leaves are
    not tensors, numpy arrays or numbers (strings), or whose shapes grow after the first batch
    (only the first dimension may shrink, as in a last partial batch). ``num_workers=0`` loads
    in the calling process with torch's own single-process iterator (nothing to hand over), and
    still copies to ``device``. See docs/loader.md.
    """

    def __init__(
        self,
        dataset: tud.Dataset[T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: tud.Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: tud.Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: str | multiprocessing.context.BaseContext | None = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        if isinstance(dataset, tud.IterableDataset):
            raise TypeError(
                "dataset: codl.loader.DataLoader takes map-style data sets (__getitem__ and "
                f"__len__), got the IterableDataset {type(dataset).__name__}"
            )
        method = (
            multiprocessing_context.get_start_method()
            if isinstance(multiprocessing_context, multiprocessing.context.BaseContext)
            else multiprocessing_context
        )
        if method not in (None, "fork"):
            raise ValueError(
                f"multiprocessing_context: codl.loader's workers are forked (they inherit the "
                f"ring), got {method!r}; pass None or 'fork'"
            )
        # torch's own DataLoader checks every argument (with torch's messages) and builds the
        # sampler and batch sampler exactly as torch would; it starts nothing.
        self._torch: tud.DataLoader[T_co] = tud.DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
        )
        if self._torch.batch_sampler is None:
            raise ValueError(
                "batch_size: codl.loader.DataLoader needs batches (an int batch_size or a "
                "batch_sampler), got batch_size=None"
            )
        self.device = _device(device)
        self.dataset = dataset
        self.batch_size = self._torch.batch_size
        self.drop_last = drop_last
        self.sampler = self._torch.sampler
        self.batch_sampler = self._torch.batch_sampler
        self.num_workers = num_workers
        self.collate_fn: Callable[[list[Any]], Any] = self._torch.collate_fn
        # torch ignores pin_memory, with a warning, where there is no accelerator.
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.generator = generator
        self.prefetch_factor = prefetch_factor if prefetch_factor is not None else _DEFAULT_PREFETCH
        self.persistent_workers = persistent_workers
        self._iterator: _RingIterator | None = None

    def __len__(self) -> int:
        return len(self._torch)

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers == 0:
            return _InProcessIterator(self)
        it = self._iterator
        if self.persistent_workers and it is not None and not it.ring_closed:
            it.reset()
            return it
        self._iterator = _RingIterator(self)
        return self._iterator

    def close(self) -> None:
        """Stop persistent workers now rather than when the loader is collected."""
        # getattr: __del__ also runs on a loader whose __init__ refused its arguments.
        it = getattr(self, "_iterator", None)
        if it is not None:
            it.close()
            self._iterator = None

    def __del__(self) -> None:
        self.close()


def _device(device: torch.device | str | None) -> torch.device | None:
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"device: expected a torch.device or a string like 'cuda:0', got {device!r}"
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {dev} requested, but torch sees no CUDA device")
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"device: 'cuda' or 'cpu' expected, got {dev}")
    return dev


def _to_device(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: _to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_to_device(v, device, non_blocking) for v in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(_to_device(v, device, non_blocking) for v in batch)
    return batch


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for v in batch.values():
            yield from _tensors(v)
    elif isinstance(batch, list | tuple):
        for v in batch:
            yield from _tensors(v)


class _InProcessIterator:
    """num_workers=0: torch's single-process iterator (the batches are made here, so there is
    nothing to hand over), then the copy to ``device``."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        self._it = iter(loader._torch)
        self._device = loader.device
        self._pin = loader.pin_memory

    def __iter__(self) -> _InProcessIterator:
        return self

    def __next__(self) -> Any:
        batch = next(self._it)
        if self._device is None:
            return batch
        return _to_device(batch, self._device, non_blocking=self._pin)

    def __len__(self) -> int:
        return len(self._it)


class _RingIterator:
    """One ring for the loader's epochs (one epoch unless ``persistent_workers``).

    Indices are drawn from the batch sampler when torch's iterator draws them: prefetch_factor x
    workers batches when the epoch starts, then one as each batch is returned. With a CUDA
    ``device`` the next batch's copy is started, if it is already in its slot, as the current
    batch is returned, so that it overlaps the caller's compute."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        self._loader = loader
        self._ring: Ring | None = None
        self._ahead: tuple[Any, Any] | None = None  # (batch on the device, its copy event)
        self._sampler: Iterator[Sequence[Any]] = iter(loader.batch_sampler)
        # As torch's iterator does when it is made: the workers' base seed from the loader's
        # generator, or the global one (advancing it exactly as torch would).
        self._base_seed = int(
            torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item()
        )
        self._yielded = 0
        first = next(self._sampler, None)
        if first is None:
            self._exhausted = True
            return
        self._exhausted = False
        device = loader.device
        spec = RingSpec(
            dataset=loader.dataset,
            workers=loader.num_workers,
            prefetch_factor=loader.prefetch_factor,
            collate_fn=loader.collate_fn,
            worker_init_fn=loader.worker_init_fn,
            page_lock=loader.pin_memory and device is not None and device.type == "cuda",
            device=device,
            timeout=float(loader.timeout),
        )
        first = list(first)
        # Rows per slot: the batch size; with a batch sampler (no batch_size), its first batch's.
        rows = max(len(first), loader.batch_size or 0)
        self._ring = Ring(spec, base_seed=self._base_seed, probe_index=first[0], rows=rows)
        try:
            self._ring.submit(first)
            self._prime(loader.prefetch_factor * loader.num_workers - 1)
        except BaseException:
            self.close()
            raise

    @property
    def ring_closed(self) -> bool:
        return self._ring is None or self._ring.closed

    def _prime(self, n: int) -> None:
        for _ in range(n):
            if not self._submit_next():
                return

    def _submit_next(self) -> bool:
        if self._exhausted:
            return False
        indices = next(self._sampler, None)
        if indices is None:
            self._exhausted = True
            return False
        assert self._ring is not None
        self._ring.submit(list(indices))
        return True

    def reset(self) -> None:
        """A new epoch on the same workers (persistent_workers): what is left of the last one is
        drained, the batch sampler starts again (its set_epoch honoured)."""
        ring = self._ring
        self._ahead = None
        if ring is None:
            self._loader._iterator = None
            return
        ring.drain()
        ring.new_epoch()
        self._sampler = iter(self._loader.batch_sampler)
        self._exhausted = False
        self._yielded = 0
        self._prime(self._loader.prefetch_factor * self._loader.num_workers)

    def __iter__(self) -> _RingIterator:
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def __next__(self) -> Any:
        ring = self._ring
        if ring is None:
            raise StopIteration
        try:
            if self._ahead is None:
                taken = ring.take()
                if taken is None:
                    self._end_of_epoch()
                    raise StopIteration
                self._ahead = self._start(taken)
            batch, event = self._ahead
            self._ahead = None
            self._yielded += 1
            # torch draws the next batch's indices before it returns this one.
            self._submit_next()
            if event is not None:
                nxt = ring.take(block=False) if ring.outstanding else None
                if nxt is not None:
                    self._ahead = self._start(nxt)
        except StopIteration:
            raise
        except BaseException:
            self.close()
            raise
        if event is not None:
            current = torch.cuda.current_stream(self._loader.device)
            current.wait_event(event)
            # Made on the loader's stream, used on the caller's: the allocator must not reuse
            # the memory before the caller's work on it is done.
            for t in _tensors(batch):
                if t.is_cuda:
                    t.record_stream(current)
        return batch

    def _start(self, taken: Taken) -> tuple[Any, Any]:
        ring = self._ring
        assert ring is not None
        device = self._loader.device
        return ring.copy_out(
            taken,
            device if device is not None else torch.device("cpu"),
            pin=self._loader.pin_memory,
        )

    def _end_of_epoch(self) -> None:
        if not self._loader.persistent_workers:
            self.close()

    def close(self) -> None:
        self._ahead = None
        if self._ring is not None:
            self._ring.close()

    def __del__(self) -> None:
        self.close()
