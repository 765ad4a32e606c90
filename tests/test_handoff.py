"""The ring hand-off (``loader.handoff: ring``): torch's batches, clear failures, nothing left."""

from __future__ import annotations

import functools
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from codl import pinning
from codl.datasets import generate
from codl.errors import DataSetError
from codl.harness import data as hdata
from codl.harness.handoff import LoaderWorkerError, RingLoader
from codl.harness.runner import _seed_worker
from codl.spec import DatasetSpec, Handoff, PinningSpec, RunSpec
from codl.trace.store import open_trace

BATCH = 4
SEED = 7


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ring") / "jpeg"
    generate(DatasetSpec(samples=12, height=40, width=48), out)
    return out


def _init_fn() -> functools.partial[None]:
    # The run's worker_init_fn (signals, placement, the run seed): a placement of the whole
    # machine with no pinning, as policy `none` plans it.
    placement = pinning.plan(PinningSpec(), allowed=os.sched_getaffinity(0), workers=3)
    return functools.partial(_seed_worker, placement, SEED, 0)


def _torch_batches(data: Path, workers: int, n: int) -> list[hdata.Batch]:
    dataset = hdata.dataset_for("jpeg", data, 32)
    torch.manual_seed(SEED)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=BATCH,
        sampler=hdata.EndlessShuffle(len(dataset), torch.Generator().manual_seed(SEED)),
        multiprocessing_context=hdata.worker_context(),
        num_workers=workers,
        prefetch_factor=2,
        drop_last=True,
        collate_fn=hdata.collate,
        worker_init_fn=_init_fn(),
    )
    it = iter(loader)
    try:
        return [next(it) for _ in range(n)]
    finally:
        it._shutdown_workers()  # type: ignore[attr-defined]


def _ring(data: Path, workers: int, dataset: object = None) -> RingLoader:
    dataset = dataset if dataset is not None else hdata.dataset_for("jpeg", data, 32)
    return RingLoader(
        dataset,
        batch_size=BATCH,
        workers=workers,
        prefetch_factor=2,
        generator=torch.Generator().manual_seed(SEED),
        worker_init_fn=_init_fn(),
    )


def _ring_batches(data: Path, workers: int, n: int) -> list[hdata.Batch]:
    torch.manual_seed(SEED)
    ring = iter(_ring(data, workers))
    out = []
    try:
        for _ in range(n):
            b = next(ring)
            x, y = ring.to_device(b, torch.device("cpu"))
            out.append(hdata.Batch(x, y, b.items, b.collate))
    finally:
        ring.close()
    return out


@pytest.mark.parametrize("workers", [1, 3])
def test_the_ring_gives_torchs_batches_in_torchs_order(jpegs: Path, workers: int) -> None:
    # 12 samples, batches of 4: 9 batches span three passes of the endless sampler, so the
    # workers' own sampler copies and the random augmentation (torch's worker seeds) both count.
    n = 9
    ours, theirs = _ring_batches(jpegs, workers, n), _torch_batches(jpegs, workers, n)
    item = hdata.ITEM_COLUMNS.index("item")
    worker = hdata.ITEM_COLUMNS.index("worker")
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert a.items[:, item].tolist() == b.items[:, item].tolist(), k
        assert torch.equal(a.targets, b.targets), k
        assert torch.equal(a.inputs, b.inputs), k
        # Batch k made by worker k mod W, as torch assigns it.
        assert set(a.items[:, worker].tolist()) == {k % workers}
    # The augmentation is random: equal inputs are not equal by accident of a constant crop.
    assert not torch.equal(ours[0].inputs[0], ours[3].inputs[0])


def test_the_ring_leaves_the_ranks_generators_as_torch_leaves_them(jpegs: Path) -> None:
    _ring_batches(jpegs, 2, 2)
    after_ring = torch.rand(3)
    _torch_batches(jpegs, 2, 2)
    after_torch = torch.rand(3)
    assert torch.equal(after_ring, after_torch)


class _Broken(torch.utils.data.Dataset[tuple[torch.Tensor, int, np.ndarray]]):
    """Good samples except one index, which raises ``error``; or kills its worker."""

    def __init__(self, inner: object, bad: int, error: BaseException | None) -> None:
        self.inner, self.bad, self.error = inner, bad, error

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, np.ndarray]:
        if i == self.bad and os.getpid() != _Broken.rank:
            if self.error is None:
                os.kill(os.getpid(), signal.SIGKILL)
            raise self.error
        return self.inner[i]  # type: ignore[index,no-any-return]

    rank = 0


@pytest.mark.parametrize(
    ("error", "kind", "text"),
    [
        (DataSetError("/data/x.jpg: not a decodable JPEG"), DataSetError, "/data/x.jpg: not a"),
        (
            ValueError("bad crop"),
            LoaderWorkerError,
            r"failed while reading sample 5 of batch \d+: ValueError: bad crop",
        ),
        (
            None,
            LoaderWorkerError,
            r"was killed by SIGKILL while reading sample 5 of batch \d+, before it delivered batch",
        ),
    ],
    ids=["data-set error", "other error", "worker killed"],
)
def test_a_failing_worker_is_a_clear_error_not_a_hang(
    jpegs: Path, error: BaseException | None, kind: type[Exception], text: str
) -> None:
    _Broken.rank = os.getpid()
    dataset = _Broken(hdata.dataset_for("jpeg", jpegs, 32), bad=5, error=error)
    ring = iter(_ring(jpegs, 2, dataset))
    start = time.monotonic()
    try:
        with pytest.raises(kind, match=text):
            for _ in range(12):
                b = next(ring)
                ring.to_device(b, torch.device("cpu"))
    finally:
        ring.close()
    assert time.monotonic() - start < 30
    assert all(not _alive(pid) for pid in ring.worker_pids()) or not ring.worker_pids()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


_RANK = textwrap.dedent(
    """
    import sys, time, torch
    from codl.harness import data as hdata
    from codl.harness.handoff import RingLoader
    ring = iter(RingLoader(hdata.dataset_for("jpeg", sys.argv[1], 32), batch_size=4, workers=3,
                           prefetch_factor=2, generator=torch.Generator().manual_seed(0)))
    b = next(ring); ring.to_device(b, torch.device("cpu"))
    print(" ".join(map(str, ring.worker_pids())), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this system")
def test_no_shared_memory_or_worker_survives_a_sigkilled_rank(jpegs: Path) -> None:
    before = _shm()
    rank = subprocess.Popen(
        [sys.executable, "-c", _RANK, str(jpegs)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert rank.stdout is not None
        pids = [int(p) for p in rank.stdout.readline().split()]
        assert len(pids) == 3 and all(_alive(p) for p in pids)
        during = _shm()
    finally:
        rank.kill()
        rank.wait(timeout=30)
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids), "a ring worker outlived its rank"
    # Nothing named: the ring is an anonymous mapping, the semaphores were unlinked at birth.
    assert during == before
    assert _shm() == before


def test_a_run_with_the_ring_traces_its_workers_like_torchs(tmp_path: Path, jpegs: Path) -> None:
    spec = RunSpec.from_dict(
        {
            "mode": "data+compute",
            "workload": {"batch_size": BATCH, "image_size": 32},
            "dataset": {"samples": 12, "height": 40, "width": 48},
            "loader": {"workers": 2, "handoff": "ring"},
            "steps": {"warmup": 1, "measured": 4},
            "seed": SEED,
        }
    )
    assert spec.loader.handoff is Handoff.RING
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_dict()))
    trace = tmp_path / "t.h5"
    cmd = [sys.executable, "-m", "codl.cli", "run", str(tmp_path / "spec.json")]
    cmd += ["--trace", str(trace), "--dataset-dir", str(jpegs)]
    before = _shm()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _shm() == before
    with open_trace(trace) as t:
        assert t.spec["loader"]["handoff"] == "ring"
        loader = t.table("events/loader")
        threads = t.table("threads")
    # Every batch's items, from the two workers, each found as a loader process by its threads.
    assert loader["pid"].nunique() == 2
    loader_pids = set(threads[threads["role"].astype(str) == "loader"]["pid"])
    assert set(loader["pid"].unique()) <= loader_pids


def test_handoff_torch_keeps_every_published_run_id() -> None:
    base = {"mode": "data+compute", "loader": {"workers": 2}}
    with_key = {"mode": "data+compute", "loader": {"workers": 2, "handoff": "torch"}}
    assert RunSpec.from_dict(base).run_id == RunSpec.from_dict(with_key).run_id
    ring = RunSpec.from_dict({"mode": "data+compute", "loader": {"workers": 2, "handoff": "ring"}})
    assert ring.run_id != RunSpec.from_dict(base).run_id
    # The ring reads no sharing strategy: both values are one run.
    other = {"workers": 2, "handoff": "ring", "sharing_strategy": "file_system"}
    assert RunSpec.from_dict({"mode": "data+compute", "loader": other}).run_id == ring.run_id


def test_no_pin_memory_thread_is_planned_for_the_ring() -> None:
    def roles(handoff: str) -> frozenset[pinning.Role]:
        spec = RunSpec.from_dict(
            {
                "mode": "data+compute",
                "device": "cuda",
                "loader": {"workers": 2, "pin_memory": True, "handoff": handoff},
            }
        )
        return pinning.roles_for(spec)

    assert pinning.Role.PIN_MEMORY in roles("torch")
    assert pinning.Role.PIN_MEMORY not in roles("ring")


def test_batches_over_passes_match_the_samplers_stream() -> None:
    from codl.harness.handoff import _batch_indices

    gen_a, gen_b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    flat = list(itertools.islice(iter(hdata.EndlessShuffle(10, gen_a)), 40))
    batches = list(itertools.islice(_batch_indices(10, gen_b, 4), 10))
    assert [i for b in batches for i in b] == flat


@pytest.mark.slow
# isolated-main on one rank: two ranks of it need more than the two CPUs a CI machine has
# (a launch CPU each plus loader CPUs), which the planner refuses whatever the hand-off.
@pytest.mark.parametrize(("policy", "ranks"), [("none", 2), ("isolated-main", 1)])
def test_ddp_ranks_load_through_their_own_rings(
    tmp_path: Path, jpegs: Path, policy: str, ranks: int
) -> None:
    from codl.harness.launch import launch

    spec = RunSpec.from_dict(
        {
            "mode": "combined",
            "workload": {"batch_size": BATCH, "image_size": 32},
            "dataset": {"samples": 12, "height": 40, "width": 48},
            "loader": {"workers": 2, "handoff": "ring"},
            "layout": {"ranks_per_node": ranks},
            "pinning": {"policy": policy},
            "steps": {"warmup": 1, "measured": 3},
        }
    )
    trace = tmp_path / "trace.h5"
    before = _shm()
    launch(spec, trace_path=trace, dataset_dir=jpegs)
    assert _shm() == before
    with open_trace(trace) as t:
        loader = t.table("events/loader")
        comm = t.table("events/comm")
    # Each rank fed by two workers of its own; with a peer, each rank's step reduced with it.
    assert loader.groupby("rank")["pid"].nunique().to_dict() == dict.fromkeys(range(ranks), 2)
    assert set(comm["rank"].unique()) == (set(range(ranks)) if ranks > 1 else set())


class _Niceness(torch.utils.data.Dataset[tuple[torch.Tensor, int, np.ndarray]]):
    """The JPEG set, each sample labelled with the nice value of the thread that loaded it."""

    def __init__(self, data: Path) -> None:
        self.inner = hdata.dataset_for("jpeg", data, 32)

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, np.ndarray]:
        x, _, timing = self.inner[index]
        return x, os.getpriority(os.PRIO_PROCESS, 0), timing


@pytest.mark.parametrize("handoff", list(Handoff))
def test_worker_nice_reaches_every_loader_worker_and_not_the_rank(
    jpegs: Path, handoff: Handoff
) -> None:
    placement = pinning.plan(PinningSpec(), allowed=os.sched_getaffinity(0), workers=2)
    init_fn = functools.partial(_seed_worker, placement, SEED, 13)
    rank_nice = os.getpriority(os.PRIO_PROCESS, 0)
    if rank_nice >= 13:
        pytest.skip(f"the suite runs at nice {rank_nice}: a worker at 13 would not differ")
    gen = torch.Generator().manual_seed(SEED)
    data = _Niceness(jpegs)
    it: Any
    if handoff is Handoff.RING:
        it = iter(
            RingLoader(
                data,
                batch_size=BATCH,
                workers=2,
                prefetch_factor=2,
                generator=gen,
                worker_init_fn=init_fn,
            )
        )
    else:
        loader = torch.utils.data.DataLoader(
            data,
            batch_size=BATCH,
            sampler=hdata.EndlessShuffle(len(data), gen),
            num_workers=2,
            collate_fn=hdata.collate,
            multiprocessing_context=hdata.worker_context(),
            worker_init_fn=init_fn,
        )
        it = iter(loader)
    try:
        seen = {int(v) for _ in range(4) for v in next(it).targets}
    finally:
        it.close() if handoff is Handoff.RING else it._shutdown_workers()
    assert seen == {13}
    assert os.getpriority(os.PRIO_PROCESS, 0) == rank_nice


@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locking needs a CUDA device")
def test_the_page_locked_ring_gives_the_cpu_rings_batches_on_the_gpu(jpegs: Path) -> None:
    """The ring registered with CUDA (after its workers are forked) holds what they wrote, and
    each batch reaches the GPU as the unregistered ring's batch, value for value."""
    n, workers = 6, 2
    want = _ring_batches(jpegs, workers, n)
    torch.manual_seed(SEED)
    ring = RingLoader(
        hdata.dataset_for("jpeg", jpegs, 32),
        batch_size=BATCH,
        workers=workers,
        prefetch_factor=2,
        generator=torch.Generator().manual_seed(SEED),
        worker_init_fn=_init_fn(),
        page_lock=True,
        device=torch.device("cuda"),
    )
    it = iter(ring)
    try:
        assert ring.page_locked  # page-locked once, before the first batch
        for k in range(n):
            b = next(it)
            x, y = it.to_device(b, torch.device("cuda"))
            assert x.is_cuda and y.is_cuda
            torch.cuda.synchronize()
            assert torch.equal(x.cpu(), want[k].inputs), k
            assert torch.equal(y.cpu(), want[k].targets), k
    finally:
        it.close()
    assert not ring.page_locked  # unregistered on close


def test_worker_nice_never_lowers_the_rank_s_own() -> None:
    """A rank already at nice 15 keeps its workers at 15 when asked for 5: lowering a nice value
    needs a privilege the run does not ask for (and would fail without it)."""
    placement = pinning.plan(PinningSpec(), allowed=os.sched_getaffinity(0), workers=1)
    ctx = hdata.worker_context()
    got = ctx.Queue()

    def child() -> None:
        os.setpriority(os.PRIO_PROCESS, 0, max(15, os.getpriority(os.PRIO_PROCESS, 0)))
        before = os.getpriority(os.PRIO_PROCESS, 0)
        _seed_worker(placement, SEED, 5, 0)
        got.put((before, os.getpriority(os.PRIO_PROCESS, 0)))

    proc = ctx.Process(target=child)
    proc.start()
    before, after = got.get(timeout=30)
    proc.join(timeout=30)
    assert proc.exitcode == 0
    assert after == before >= 15
