"""``loader.copy_ahead``: the ring hand-off starts the next batch's copy one batch ahead.

On the CPU the copy ahead is made at once (no side stream), so these tests run its whole
bookkeeping in CI: the same batches in the same order as without it, the batch copied ahead
handed over by the next ``next()``, and nothing left behind by ``close()``."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from codl import pinning
from codl.config import build_plan
from codl.datasets import generate
from codl.errors import ConfigError, DataSetError
from codl.harness import data as hdata
from codl.harness.handoff import RingLoader
from codl.harness.runner import _seed_worker
from codl.spec import DatasetSpec, PinningSpec, RunSpec
from codl.trace.store import open_trace

BATCH = 4
SEED = 7
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ahead") / "jpeg"
    generate(DatasetSpec(samples=12, height=40, width=48), out)
    return out


def _ring(
    data: Path, workers: int, *, copy_ahead: bool, dataset: object = None, **kw: Any
) -> RingLoader:
    placement = pinning.plan(PinningSpec(), allowed=os.sched_getaffinity(0), workers=workers)
    return RingLoader(
        dataset if dataset is not None else hdata.dataset_for("jpeg", data, 32),
        batch_size=BATCH,
        workers=workers,
        prefetch_factor=2,
        generator=torch.Generator().manual_seed(SEED),
        worker_init_fn=functools.partial(_seed_worker, placement, SEED, 0),
        copy_ahead=copy_ahead,
        **kw,
    )


def _batches(
    data: Path, workers: int, n: int, *, copy_ahead: bool, pause: float = 0.0
) -> tuple[list[hdata.Batch], int]:
    """``n`` batches as the runner takes them (``next()``, then ``to_device``), and how many
    were copied ahead; ``pause`` between the two lets the workers fill the next batch."""
    torch.manual_seed(SEED)
    ring = _ring(data, workers, copy_ahead=copy_ahead)
    it = iter(ring)
    out = []
    try:
        for _ in range(n):
            b = next(it)
            time.sleep(pause)
            x, y = it.to_device(b, CPU)
            out.append(hdata.Batch(x, y, b.items, b.collate))
    finally:
        it.close()
    return out, ring.ahead_count


@pytest.mark.parametrize("workers", [1, 3])
def test_copy_ahead_gives_the_same_batches_in_the_same_order(jpegs: Path, workers: int) -> None:
    # 9 batches span three passes of the endless sampler (12 samples, batches of 4).
    n = 9
    want, none_ahead = _batches(jpegs, workers, n, copy_ahead=False, pause=0.05)
    got, ahead = _batches(jpegs, workers, n, copy_ahead=True, pause=0.05)
    assert none_ahead == 0
    # The pause lets the next batch be filled: the ahead path is what this test runs.
    assert ahead > 0
    worker = hdata.ITEM_COLUMNS.index("worker")
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert np.array_equal(a.items[:, :worker], b.items[:, :worker]), k
        assert a.items[:, worker].tolist() == b.items[:, worker].tolist(), k
        assert torch.equal(a.inputs, b.inputs), k
        assert torch.equal(a.targets, b.targets), k
        assert set(a.items[:, worker].tolist()) == {k % workers}
    # The timing rows were taken out of the slot before it went back: each batch's own.
    item = hdata.ITEM_COLUMNS.index("item")
    assert len({tuple(b.items[:, item].tolist()) for b in got[:3]}) == 3


def test_the_batch_copied_ahead_is_handed_by_next_and_only_waited_for(jpegs: Path) -> None:
    ring = _ring(jpegs, 2, copy_ahead=True)
    it = iter(ring)
    try:
        b0 = next(it)
        time.sleep(0.3)  # batch 1 is filled meanwhile
        it.to_device(b0, CPU)
        assert ring._ahead is not None and ring.ahead_count == 1
        ahead = ring._ahead[0]
        b1 = next(it)
        assert b1 is ahead and ring._ahead is None
        x, y = it.to_device(b1, CPU)
        # Its inputs and targets are the copies made ahead: to_device copies nothing again.
        assert x is ahead.inputs and y is ahead.targets
        with pytest.raises(Exception, match="without a batch taken"):
            it.to_device(b1, CPU)
    finally:
        it.close()


class _Slow(torch.utils.data.Dataset[Any]):
    """A data set whose every sample takes ``delay`` seconds to read."""

    def __init__(self, inner: Any, delay: float) -> None:
        self.inner, self.delay = inner, delay

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        time.sleep(self.delay)
        return self.inner[i]


def test_without_a_ready_batch_nothing_is_taken_ahead(jpegs: Path) -> None:
    # One worker, one slot per worker in flight: batch 1 is asked of the worker only when batch
    # 0's slot goes back, and its samples take 0.1 s each to read, so right after batch 0's copy
    # it is not filled whatever the machine's load, and next() takes it as without copy_ahead
    # (a blocking take).
    ring = RingLoader(
        _Slow(hdata.dataset_for("jpeg", jpegs, 32), 0.1),
        batch_size=BATCH,
        workers=1,
        prefetch_factor=1,
        generator=torch.Generator().manual_seed(SEED),
        copy_ahead=True,
    )
    it = iter(ring)
    try:
        for _ in range(3):
            b = next(it)
            it.to_device(b, CPU)
        assert ring.ahead_count == 0
    finally:
        it.close()


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def test_close_drops_a_batch_copied_ahead(jpegs: Path) -> None:
    before = _shm()
    ring = _ring(jpegs, 3, copy_ahead=True)
    it = iter(ring)
    b = next(it)
    time.sleep(0.3)
    it.to_device(b, CPU)
    assert ring._ahead is not None
    pids = ring.worker_pids()
    it.close()
    assert ring._ahead is None and ring._handed is None
    assert _shm() == before
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # A new iter() starts again from batch 0, with nothing ahead.
    it = iter(ring)
    try:
        assert ring._ahead is None
        next(it)
    finally:
        it.close()


class _Broken(torch.utils.data.Dataset[tuple[torch.Tensor, int, np.ndarray]]):
    """Good samples except index 5, which raises a data-set error in a worker."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.rank = os.getpid()

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, np.ndarray]:
        if i == 5 and os.getpid() != self.rank:
            raise DataSetError("/data/x.jpg: not a decodable JPEG")
        return self.inner[i]  # type: ignore[index,no-any-return]


def test_a_failure_found_ahead_is_raised_by_next(jpegs: Path) -> None:
    """The take ahead never raises from to_device: the ring keeps the failure and next()
    raises it, in the data-wait phase, as without copy_ahead."""
    dataset = _Broken(hdata.dataset_for("jpeg", jpegs, 32))
    it = iter(_ring(jpegs, 2, copy_ahead=True, dataset=dataset))
    try:
        with pytest.raises(DataSetError, match="not a decodable JPEG"):
            for _ in range(12):
                b = next(it)
                time.sleep(0.05)
                it.to_device(b, CPU)
    finally:
        it.close()


def _spec(**loader: object) -> RunSpec:
    return RunSpec.from_dict({"mode": "data+compute", "loader": {"workers": 2, **loader}})


def test_copy_ahead_at_its_default_keeps_every_run_id() -> None:
    ring = _spec(handoff="ring")
    assert _spec(handoff="ring", copy_ahead=False).run_id == ring.run_id
    assert "copy_ahead" not in ring.canonical_json()
    assert _spec(handoff="ring", copy_ahead=True).run_id != ring.run_id
    assert _spec().run_id == _spec(copy_ahead=False).run_id


def test_copy_ahead_with_torchs_handoff_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        _spec(copy_ahead=True)
    (problem,) = info.value.problems
    assert problem.startswith("loader.copy_ahead: true with loader.handoff 'torch'")
    assert "\n" not in problem


def test_copy_ahead_is_a_factor() -> None:
    cfg = {
        "experiments": [
            {
                "name": "e",
                "base": {"mode": "data+compute", "loader": {"workers": 2, "handoff": "ring"}},
                "factors": {"loader.copy_ahead": [False, True]},
            }
        ]
    }
    specs = [r.spec for r in build_plan(cfg).runs]
    assert [s.loader.copy_ahead for s in specs] == [False, True]
    with pytest.raises(ConfigError, match=r"loader\.copy_ahead"):
        build_plan({"experiments": [{**cfg["experiments"][0], "base": {"mode": "data"}}]})
    # The schema types it.
    with pytest.raises(ConfigError, match=r"copy_ahead"):
        _spec(handoff="ring", copy_ahead="yes")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the side stream needs a CUDA device")
@pytest.mark.parametrize("page_lock", [False, True])
def test_on_the_gpu_the_batches_copied_ahead_are_the_cpu_rings(
    jpegs: Path, page_lock: bool
) -> None:
    """Copied ahead on the ring's stream while the rank's stream is busy, each batch reaches the
    GPU value for value as the CPU ring gives it without copy_ahead."""
    n, workers = 8, 2
    want, _ = _batches(jpegs, workers, n, copy_ahead=False)
    torch.manual_seed(SEED)
    cuda = torch.device("cuda")
    ring = _ring(jpegs, workers, copy_ahead=True, page_lock=page_lock, device=cuda)
    it = iter(ring)
    worker = hdata.ITEM_COLUMNS.index("worker")
    busy = torch.randn(2048, 2048, device=cuda)
    try:
        for k in range(n):
            b = next(it)
            time.sleep(0.05)
            x, y = it.to_device(b, cuda)
            # Work on the rank's stream while the next copy runs on the ring's.
            for _ in range(4):
                busy = busy @ busy
                busy /= busy.norm()
            assert torch.equal(x.cpu(), want[k].inputs), k
            assert torch.equal(y.cpu(), want[k].targets), k
            # The item and worker columns; the rest are this run's pids, CPUs and clocks.
            assert np.array_equal(b.items[:, : worker + 1], want[k].items[:, : worker + 1]), k
    finally:
        it.close()
    assert ring.ahead_count > 0
    assert not ring.page_locked


@pytest.mark.parametrize("copy_ahead", [True, False])
def test_a_run_records_how_many_batches_were_copied_ahead(
    tmp_path: Path, jpegs: Path, copy_ahead: bool
) -> None:
    """The trace says whether the copies were made ahead at all (``copied_ahead``): a run whose
    loader never keeps up would carry every copy in its H2D phase despite the setting."""
    spec = RunSpec.from_dict(
        {
            "mode": "data+compute",
            "workload": {"batch_size": BATCH, "image_size": 32},
            "dataset": {"samples": 12, "height": 40, "width": 48},
            "loader": {"workers": 2, "handoff": "ring", "copy_ahead": copy_ahead},
            "steps": {"warmup": 1, "measured": 6},
            "seed": SEED,
        }
    )
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_dict()))
    trace = tmp_path / "t.h5"
    cmd = [sys.executable, "-m", "codl.cli", "run", str(tmp_path / "spec.json")]
    cmd += ["--trace", str(trace), "--dataset-dir", str(jpegs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open_trace(trace) as t:
        attrs = t.attrs
    if copy_ahead:
        # Each step hands over one batch; the first is never copied ahead.
        assert 0 <= attrs["copied_ahead"] <= spec.steps.total - 1
    else:
        assert "copied_ahead" not in attrs
