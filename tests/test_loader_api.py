"""codl.loader.DataLoader: torch's batches in torch's order, its arguments, its refusals."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import numpy.random  # before any fork (see codl.loader._ring)
import pytest
import torch
import torch.utils.data as tud

from codl.loader import BatchLayoutError, DataLoader, DataSetError, LoaderWorkerError

N = 11  # samples: batches of 4 leave a partial last batch of 3


class Pair(NamedTuple):
    image: torch.Tensor
    label: int


class Augmented(tud.Dataset[Any]):
    """Every sample draws from torch's, numpy's and Python's generators, so equal batches mean
    equal worker seeds as well as equal indices; ``shape`` picks the sample's form."""

    def __init__(self, form: str = "dict", n: int = N) -> None:
        self.form, self.n = form, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        x = torch.full((2, 3), float(i)) + torch.rand(2, 3)
        noise = np.random.rand(2).astype(np.float32)
        jitter = random.random()
        if self.form == "dict":
            return {"image": x, "meta": {"noise": noise, "jitter": jitter}, "label": i}
        if self.form == "tuple":
            return x, i, [noise, jitter]
        return Pair(x, i)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    return bool(a == b)


def _epochs(make: Callable[[], Any], epochs: int, set_epoch: Any = None) -> list[Any]:
    # In-process loading (num_workers=0) draws from the rank's generators: all three seeded.
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    loader = make()
    out = []
    for e in range(epochs):
        if set_epoch is not None:
            set_epoch(loader, e)
        out.append(list(loader))
    return out


def _same_as_torch(epochs: int = 2, set_epoch: Any = None, **kwargs: Any) -> list[Any]:
    def make(cls: type) -> Callable[[], Any]:
        def build() -> Any:
            kw = dict(kwargs)
            ds = kw.pop("dataset", None) or Augmented(kw.pop("form", "dict"))
            if "seed" in kw:
                kw["generator"] = torch.Generator().manual_seed(kw.pop("seed"))
            if "shard" in kw:
                rank, world = kw.pop("shard")
                kw["sampler"] = tud.DistributedSampler(ds, num_replicas=world, rank=rank, seed=3)
            return cls(ds, **kw)

        return build

    ours = _epochs(make(DataLoader), epochs, set_epoch)
    theirs = _epochs(make(tud.DataLoader), epochs, set_epoch)
    assert [len(e) for e in ours] == [len(e) for e in theirs]
    for e, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            assert _equal(x, y), (e, k, x, y)
    return ours


# Each worker count, each of shuffle and drop_last both ways (all 12 cost a CPU test budget).
@pytest.mark.parametrize(
    ("workers", "shuffle", "drop_last"),
    [(1, True, False), (2, False, True), (3, True, True), (3, False, False)],
)
def test_same_batches_in_the_same_order_as_torch(
    workers: int, shuffle: bool, drop_last: bool
) -> None:
    got = _same_as_torch(
        epochs=2, batch_size=4, shuffle=shuffle, drop_last=drop_last, num_workers=workers
    )
    rows = [len(b["label"]) for b in got[0]]
    assert rows == ([4, 4] if drop_last else [4, 4, 3])
    # Random augmentation: equal batches are not equal for want of randomness.
    assert not torch.equal(got[0][0]["image"][0], got[1][0]["image"][0]) or shuffle is False


@pytest.mark.parametrize("form", ["tuple", "named"])
def test_tuple_and_named_tuple_batches_keep_their_types(form: str) -> None:
    got = _same_as_torch(epochs=1, form=form, batch_size=4, shuffle=True, num_workers=2)
    first = got[0][0]
    assert type(first) is (list if form == "tuple" else Pair)


def test_a_generator_decides_the_order_and_the_worker_seeds() -> None:
    a = _same_as_torch(epochs=2, batch_size=3, shuffle=True, num_workers=2, seed=5)
    b = _same_as_torch(epochs=2, batch_size=3, shuffle=True, num_workers=2, seed=6)
    assert not _equal(a[0][0]["label"], b[0][0]["label"]) or not _equal(
        a[0][0]["image"], b[0][0]["image"]
    )


@pytest.mark.parametrize("persistent", [True, False])
def test_distributed_shards_follow_set_epoch(persistent: bool) -> None:
    def set_epoch(loader: Any, e: int) -> None:
        loader.sampler.set_epoch(e)

    for rank in range(2):
        got = _same_as_torch(
            epochs=3,
            set_epoch=set_epoch,
            shard=(rank, 2),
            batch_size=2,
            num_workers=2,
            persistent_workers=persistent,
        )
        orders = [[int(i) for b in epoch for i in b["label"]] for epoch in got]
        assert orders[0] != orders[1]  # set_epoch reshuffled


def test_persistent_workers_keep_their_processes_and_their_random_state() -> None:
    # Compared with torch over epochs: a persistent worker carries its generators on.
    _same_as_torch(epochs=3, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True)
    loader = DataLoader(Augmented(), batch_size=4, num_workers=2, persistent_workers=True)
    list(loader)
    it = loader._iterator
    assert it is not None and it._ring is not None
    pids = it._ring.worker_pids()
    list(loader)
    assert loader._iterator is it and it._ring.worker_pids() == pids
    loader.close()
    _wait_gone(pids)


def test_an_unfinished_persistent_epoch_is_drained_before_the_next() -> None:
    def half_then_all(make: type) -> list[Any]:
        torch.manual_seed(0)
        loader = make(
            Augmented(), batch_size=2, shuffle=True, num_workers=2, persistent_workers=True
        )
        it = iter(loader)
        first = [next(it), next(it)]
        return first + list(loader)

    ours, theirs = half_then_all(DataLoader), half_then_all(tud.DataLoader)
    assert len(ours) == len(theirs) == 2 + 6
    assert all(_equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_worker_init_fn_and_get_worker_info_see_the_worker() -> None:
    class Who(tud.Dataset[Any]):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> Any:
            info = tud.get_worker_info()
            assert info is not None
            return torch.tensor([info.id, info.num_workers, info.seed, os.getpid(), Who.init])

        init = -1

    def init(worker_id: int) -> None:
        Who.init = 100 + worker_id

    torch.manual_seed(1)
    ours = list(DataLoader(Who(), batch_size=2, num_workers=2, worker_init_fn=init))
    torch.manual_seed(1)
    theirs = list(tud.DataLoader(Who(), batch_size=2, num_workers=2, worker_init_fn=init))
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        # id, num_workers, seed equal torch's; batch k made by worker k mod 2; the init ran there.
        assert a[:, :3].tolist() == b[:, :3].tolist()
        assert set(a[:, 0].tolist()) == {k % 2} and set(a[:, 4].tolist()) == {100 + k % 2}
        assert os.getpid() not in a[:, 3].tolist()


def test_len_and_the_in_process_fallback_match_torch() -> None:
    got = _same_as_torch(epochs=2, batch_size=4, shuffle=True, num_workers=0)
    assert len(DataLoader(Augmented(), batch_size=4)) == len(got[0]) == 3
    assert len(DataLoader(Augmented(), batch_size=4, drop_last=True)) == 2


def test_a_batch_sampler_gives_the_batches() -> None:
    batches = [[0, 1, 2], [5, 4], [10, 9, 8]]
    got = _same_as_torch(epochs=1, batch_sampler=batches, num_workers=2)
    assert [b["label"].tolist() for b in got[0]] == batches


def test_the_caller_keeps_its_batch_after_the_slot_is_reused() -> None:
    loader = DataLoader(Augmented(n=40), batch_size=2, num_workers=1, prefetch_factor=1)
    batches = list(loader)
    assert [b["label"].tolist() for b in batches] == [[i, i + 1] for i in range(0, 40, 2)]


# -- refusals: one line naming the argument or the field -----------------------------------------
class _Texts(tud.Dataset[Any]):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> Any:
        return {"x": torch.zeros(2), "name": f"sample-{i}"}


class _Growing(tud.Dataset[Any]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> Any:
        return torch.zeros(3), torch.zeros(1 + i // 4)


def test_a_string_field_is_named() -> None:
    with pytest.raises(BatchLayoutError, match=r"^batch\['name'\]\[0\] is a str: .*tensors, numpy"):
        iter(DataLoader(_Texts(), batch_size=2, num_workers=1))


def test_a_shape_that_grows_is_named_with_what_was_expected() -> None:
    loader = DataLoader(_Growing(), batch_size=4, num_workers=1)
    with pytest.raises(BatchLayoutError) as exc:
        list(loader)
    text = str(exc.value)
    assert "\n" not in text
    assert "batch[1]: float32[4, 2] in batch 1, expected float32[4, 1]" in text
    assert "loader worker 0 (pid " in text


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"num_workers": -1}, ValueError, "num_workers option should be non-negative"),
        ({"batch_size": None}, ValueError, "^batch_size: .*got batch_size=None"),
        (
            {"num_workers": 1, "multiprocessing_context": "spawn"},
            ValueError,
            "multiprocessing_context",
        ),
        ({"device": "tpu"}, ValueError, "^device: "),
        ({"shuffle": True, "sampler": [0, 1]}, ValueError, "sampler option is mutually exclusive"),
        ({"num_workers": 1, "timeout": -1}, ValueError, "timeout option should be non-negative"),
    ],
)
def test_bad_arguments_are_refused_like_torch(
    kwargs: dict[str, Any], error: type, text: str
) -> None:
    with pytest.raises(error, match=text):
        iter(DataLoader(Augmented(), **kwargs))


def test_an_iterable_dataset_is_refused() -> None:
    class Stream(tud.IterableDataset[int]):
        def __iter__(self) -> Any:
            return iter(range(3))

    with pytest.raises(TypeError, match=r"^dataset: .*map-style"):
        DataLoader(Stream(), num_workers=1)


# -- faults: named, and nothing left behind ------------------------------------------------------
class _Faulty(tud.Dataset[Any]):
    def __init__(self, fault: str) -> None:
        self.fault, self.rank = fault, os.getpid()

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> Any:
        if i == 7 and os.getpid() != self.rank:
            if self.fault == "kill":
                os.kill(os.getpid(), 9)
            if self.fault == "data":
                raise DataSetError("/data/7.jpg: not a decodable JPEG")
            raise KeyError("no such key")
        return torch.zeros(2)


@pytest.mark.parametrize(
    ("fault", "error", "text"),
    [
        ("kill", LoaderWorkerError, r"was killed by SIGKILL while reading sample 7 of batch 3"),
        ("data", DataSetError, r"failed while reading sample 7 of batch 3: /data/7.jpg: not a"),
        ("other", LoaderWorkerError, r"failed while reading sample 7 of batch 3: KeyError: 'no"),
    ],
)
def test_a_fault_names_the_worker_its_pid_and_the_sample(
    fault: str, error: type, text: str
) -> None:
    shm = _shm()
    loader = DataLoader(_Faulty(fault), batch_size=2, num_workers=2)
    it = iter(loader)
    assert isinstance(it, object)
    pids = it._ring.worker_pids()  # type: ignore[attr-defined]
    start = time.monotonic()
    with pytest.raises(error, match=rf"^loader worker 1 \(pid {pids[1]}\) .*{text}") as exc:
        list(it)
    assert "\n" not in str(exc.value)
    assert time.monotonic() - start < 20
    _wait_gone(pids)
    assert _shm() == shm


_RANK = textwrap.dedent(
    """
    import sys, time, torch
    from codl.loader import DataLoader

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            return torch.zeros(4)

    it = iter(DataLoader(Slow(), batch_size=4, num_workers=3, persistent_workers=True))
    next(it)
    print(" ".join(map(str, it._ring.worker_pids())), flush=True)
    found = [m for m in sys.modules if m.startswith(("codl.harness", "snakemake"))]
    print(" ".join(found), flush=True)
    time.sleep(600)
    """
)


def test_workers_die_with_a_killed_rank_and_the_import_is_harness_free() -> None:
    shm = _shm()
    rank = subprocess.Popen([sys.executable, "-c", _RANK], stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout is not None
        pids = [int(p) for p in rank.stdout.readline().split()]
        imported = rank.stdout.readline().strip()
        assert len(pids) == 3 and all(_alive(p) for p in pids)
    finally:
        rank.kill()
        rank.wait(timeout=30)
    _wait_gone(pids)
    assert imported == ""
    assert _shm() == shm


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int]) -> None:
    end = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], "a loader worker outlived its loader"


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


# -- the GPU ------------------------------------------------------------------------------------
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("pin", [True, False])
def test_device_batches_equal_torchs_copied(pin: bool) -> None:
    torch.manual_seed(0)
    ours = list(
        DataLoader(
            Augmented(n=40),
            batch_size=4,
            shuffle=True,
            num_workers=2,
            pin_memory=pin,
            device="cuda",
        )
    )
    torch.manual_seed(0)
    theirs = list(tud.DataLoader(Augmented(n=40), batch_size=4, shuffle=True, num_workers=2))
    for a, b in zip(ours, theirs, strict=True):
        assert a["image"].is_cuda and a["label"].is_cuda
        # numpy leaves stay numpy (as torch's default collate makes tensors of them, so here).
        assert _equal(a["image"].cpu(), b["image"]) and _equal(a["label"].cpu(), b["label"])
        # The slot is reused for a later batch: these must be copies that outlive it.
        torch.cuda._sleep(1_000_000)  # type: ignore[no-untyped-call]


def test_a_hung_probe_ends_in_the_timeout() -> None:
    class Hangs(tud.Dataset[Any]):
        rank = os.getpid()

        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> Any:
            if os.getpid() != Hangs.rank:
                time.sleep(3600)
            return torch.zeros(1)

    start = time.monotonic()
    with pytest.raises(
        LoaderWorkerError,
        match=r"layout probe \(pid \d+, reading sample 0 .*"
        r"timeout of 0.5 s",
    ):
        iter(DataLoader(Hangs(), batch_size=2, num_workers=1, timeout=0.5))
    assert time.monotonic() - start < 10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_next_batch_is_copied_while_the_current_one_is_used() -> None:
    loader = DataLoader(
        Augmented(n=24), batch_size=4, num_workers=2, pin_memory=True, device="cuda"
    )
    it = iter(loader)
    first = next(it)
    time.sleep(0.5)  # the workers fill their slots meanwhile
    second = next(it)
    # As it returned the second batch, the loader started the third's copy on its own stream.
    ahead = it._ahead  # type: ignore[attr-defined]
    assert ahead is not None and ahead[0]["image"].is_cuda and ahead[1] is not None
    assert first["label"].tolist() == [0, 1, 2, 3] and second["label"].tolist() == [4, 5, 6, 7]
    rest = list(it)
    assert [b["label"].tolist()[0] for b in rest] == [8, 12, 16, 20]
    assert it._ring.page_locked is False  # type: ignore[attr-defined]  # closed at the end
