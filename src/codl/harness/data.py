"""Instrumented input pipeline: real files, real decode, real augmentation, per-item timing.

The per-sample cost of a JPEG data set (``dataset.cost``, recorded in its MANIFEST) picks the
pipeline: ``light`` reads pre-decoded uint8 arrays and crops + flips them, ``standard`` decodes
JPEG and applies the ImageNet training augmentation, ``heavy`` adds colour jitter and blur.

Each sample carries its own timing row (item, worker, pid, tid, cpu, four timestamps); the collate
function stacks them into one int64 array shipped with the batch. No lock, queue or shared buffer
is touched per event, so tracing adds a few hundred nanoseconds per item to the worker.
"""

from __future__ import annotations

import ctypes
import io
import json
import multiprocessing
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, get_worker_info

from codl.errors import DataSetError
from codl.paths import DATASET_MANIFEST as MANIFEST
from codl.spec import DatasetCost
from codl.trace.clock import now_ns

_libc = ctypes.CDLL(None, use_errno=True)

# Column order of the per-item timing rows: fetch = read bytes, decode = bytes -> tensor,
# transform = augmentation. t1 ends fetch and starts decode, and so on.
ITEM_COLUMNS = ("item", "worker", "pid", "tid", "cpu", "t0", "t1", "t2", "t3")
COLLATE_COLUMNS = ("worker", "pid", "tid", "cpu", "t0", "t1")


def current_cpu() -> int:
    return int(_libc.sched_getcpu())


class _RingWorker:
    """Set in a worker that is not torch's (codl.harness.handoff's ring): it has no worker info."""

    id: int | None = None


def set_worker_id(worker_id: int) -> None:
    """Name the calling process a loader worker for the timing rows (the ring's workers)."""
    _RingWorker.id = worker_id


def _worker_id() -> int:
    if _RingWorker.id is not None:
        return _RingWorker.id
    info = get_worker_info()
    return -1 if info is None else int(info.id)


_NORMALIZE_MEAN = [0.485, 0.456, 0.406]
_NORMALIZE_STD = [0.229, 0.224, 0.225]


def train_transform(image_size: int, cost: DatasetCost = DatasetCost.STANDARD) -> Any:
    """The training augmentation of a data set's cost, on uint8 CHW tensors (transforms v2).

    ``standard`` is the ImageNet one. ``light`` crops without resampling (pad if the image is
    smaller): no interpolation, the cheapest augmentation that still varies the sample.
    ``heavy`` adds colour jitter (hue included, the costly part) and a Gaussian blur: about 3x
    ``standard`` per sample on a CPU core.
    """
    from torchvision.transforms import v2

    if cost is DatasetCost.LIGHT:
        crop: list[Any] = [v2.RandomCrop(image_size, pad_if_needed=True)]
    else:
        crop = [v2.RandomResizedCrop(image_size, antialias=True)]
    extra: list[Any] = []
    if cost is DatasetCost.HEAVY:
        extra = [v2.ColorJitter(0.4, 0.4, 0.4, 0.1), v2.GaussianBlur(5, sigma=(0.1, 2.0))]
    return v2.Compose(
        [
            *crop,
            v2.RandomHorizontalFlip(),
            *extra,
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean=_NORMALIZE_MEAN, std=_NORMALIZE_STD),
        ]
    )


def timing_row(index: int, t0: int, t1: int, t2: int, t3: int) -> np.ndarray:
    """The loader level's row of one sample (ITEM_COLUMNS) made in the calling worker: fetch
    from ``t0`` to ``t1``, decode to ``t2``, transform to ``t3`` (``codl.trace.clock.now_ns``).
    Every workload's samples carry one (codl.harness.workloads)."""
    return np.array(
        [
            index,
            _worker_id(),
            os.getpid(),
            threading.get_native_id(),
            current_cpu(),
            t0,
            t1,
            t2,
            t3,
        ],
        dtype=np.int64,
    )


class Batch(NamedTuple):
    inputs: torch.Tensor
    targets: torch.Tensor
    items: np.ndarray  # (batch, len(ITEM_COLUMNS)) int64
    collate: np.ndarray  # (len(COLLATE_COLUMNS),) int64


class ImageFolderFiles(Dataset[tuple[torch.Tensor, int, np.ndarray]]):
    """ImageFolder of a JPEG data set: fetch bytes, decode, augment.

    At ``cost: light`` the files are pre-decoded ``.npy`` arrays and decode is parsing the
    array header; otherwise JPEGs decoded with torchvision.io.
    """

    def __init__(
        self, root: Path, image_size: int, *, cost: DatasetCost = DatasetCost.STANDARD
    ) -> None:
        self.pre_decoded = cost is DatasetCost.LIGHT
        suffix = ".npy" if self.pre_decoded else ".jpg"
        classes = sorted(p.name for p in Path(root).iterdir() if p.is_dir())
        self.samples: list[tuple[str, int]] = [
            (str(f), label)
            for label, c in enumerate(classes)
            for f in sorted((Path(root) / c).glob(f"*{suffix}"))
        ]
        if not self.samples:
            raise FileNotFoundError(
                f"no {suffix} files under {root} (expected <class>/<image>{suffix}; "
                f"dataset.cost {cost.value!r})"
            )
        self.transform = train_transform(image_size, cost)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, np.ndarray]:
        path, label = self.samples[index]
        t0 = now_ns()
        with open(path, "rb") as f:
            raw = f.read()
        t1 = now_ns()
        img = self._decode(path, raw)
        t2 = now_ns()
        out = self.transform(img)
        t3 = now_ns()
        return out, label, timing_row(index, t0, t1, t2, t3)

    def _decode(self, path: str, raw: bytes) -> torch.Tensor:
        from torchvision.io import ImageReadMode, decode_jpeg

        if self.pre_decoded:
            try:
                arr = np.load(io.BytesIO(raw), allow_pickle=False)
            except ValueError as exc:
                raise DataSetError(f"{path}: not a readable .npy array ({exc})") from None
            if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[0] != 3:
                raise DataSetError(
                    f"{path}: array {arr.dtype}{list(arr.shape)}, expected uint8 [3, H, W]"
                )
            return torch.from_numpy(arr)
        try:
            img: torch.Tensor = decode_jpeg(
                torch.frombuffer(bytearray(raw), dtype=torch.uint8), ImageReadMode.RGB
            )
        except RuntimeError as exc:
            raise DataSetError(f"{path}: not a decodable JPEG ({exc})") from None
        return img


class VolumeFiles(Dataset[tuple[torch.Tensor, torch.Tensor, np.ndarray]]):
    """CosmoFlow-like HDF5 cubes: fetch = read the file, decode = to tensor, transform = flips."""

    def __init__(self, root: Path, image_size: int, *, train: bool = True) -> None:
        self.files = sorted(str(p) for p in Path(root).glob("sample_*.h5"))
        if not self.files:
            raise FileNotFoundError(f"no sample_*.h5 volume files under {root}")
        self.image_size = image_size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        import h5py

        t0 = now_ns()
        with h5py.File(self.files[index], "r") as f:
            x = f["x"][...]
            y = f["y"][...]
        t1 = now_ns()
        vol = torch.from_numpy(x)
        target = torch.from_numpy(y)
        t2 = now_ns()
        s = self.image_size
        vol = vol[:, :s, :s, :s]
        # Random axis flips are the CosmoFlow augmentation.
        gen = torch.Generator().manual_seed(index)
        for axis in (1, 2, 3):
            if bool(torch.randint(0, 2, (1,), generator=gen)):
                vol = vol.flip(axis)
        vol = vol.contiguous()
        t3 = now_ns()
        return vol, target, timing_row(index, t0, t1, t2, t3)


def collate(samples: Sequence[tuple[Any, Any, np.ndarray]]) -> Batch:
    t0 = now_ns()
    inputs = torch.stack([s[0] for s in samples])
    first = samples[0][1]
    if isinstance(first, torch.Tensor):
        targets = torch.stack([s[1] for s in samples])
    else:
        targets = torch.tensor([s[1] for s in samples], dtype=torch.long)
    items = np.stack([s[2] for s in samples])
    t1 = now_ns()
    return Batch(inputs, targets, items, collate_row(t0, t1))


def collate_row(t0: int, t1: int) -> np.ndarray:
    """The collate event of the calling worker (COLLATE_COLUMNS), from ``t0`` to ``t1``."""
    return np.array(
        [_worker_id(), os.getpid(), threading.get_native_id(), current_cpu(), t0, t1],
        dtype=np.int64,
    )


def dataset_cost(root: Path) -> DatasetCost:
    """The per-sample cost a data set was built for, from its MANIFEST (``standard`` for a
    directory without one, or a manifest written before costs existed)."""
    path = Path(root) / MANIFEST
    try:
        spec = json.loads(path.read_text()).get("spec", {})
    except FileNotFoundError:
        return DatasetCost.STANDARD
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise DataSetError(f"{path}: unreadable data set manifest ({exc})") from None
    value = spec.get("cost", DatasetCost.STANDARD.value) if isinstance(spec, dict) else None
    try:
        return DatasetCost(str(value))
    except ValueError:
        allowed = [c.value for c in DatasetCost]
        raise DataSetError(f"{path}: spec.cost {value!r}, expected one of {allowed}") from None


def dataset_for(kind: str, root: Path, image_size: int) -> Dataset[Any]:
    """The data set of ``kind`` under ``root``; a JPEG set's pipeline follows its cost."""
    if kind == "jpeg":
        return ImageFolderFiles(root, image_size, cost=dataset_cost(root))
    if kind == "volume":
        return VolumeFiles(root, image_size)
    raise DataSetError(f"data set kind {kind!r}, expected 'jpeg' or 'volume'")


class EndlessShuffle(Sampler[int]):
    """The indices of a data set in a new random order on every pass, without end.

    One DataLoader iterator then spans every step of a run. With a finite sampler each epoch
    ends with the workers' prefetch drained, and the next epoch's first batch costs a whole
    batch's production time: a stall every ``len(data) / batch`` steps (seen on two H200s:
    0.5-0.8 s of data wait every 8 steps with 2,048 JPEGs, batch 128, 12 workers) that is an
    artefact of the data set's size, not interference. Batches may span two passes.
    """

    def __init__(self, size: int, generator: torch.Generator) -> None:
        self.size = size
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        while True:
            yield from torch.randperm(self.size, generator=self.generator).tolist()


def worker_context() -> multiprocessing.context.BaseContext | None:
    """The multiprocessing context for loader workers: ``fork`` wherever the platform has it.

    Rank processes are started with ``spawn`` (torch.multiprocessing), and a spawned process
    inherits ``spawn`` as its default start method, so DataLoader workers would be spawned too:
    each a fresh interpreter importing torch, started one after another (the parent blocks until
    the child has read its pickled state). Seen on two H200s: 40-90 s before the first step with
    12 workers per rank, against 7 s without a loader. A worker forked from the rank is what a
    torchrun-started training gets, starts in milliseconds and touches no CUDA state.
    """
    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return None
