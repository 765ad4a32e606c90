"""The ring hand-off under faults: a worker killed, failing, exiting or hung, the rank killed.

Each fault must end in one clear line that names the worker, its pid and how it ended, within
seconds (a hang here fails the test: every wait is bounded by an alarm or a subprocess timeout),
with no loader worker left alive, nothing new in /dev/shm and no batch handed out that is not
the one a clean run gives.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import numpy as np
import psutil
import pytest
import torch

from codl.datasets import generate
from codl.errors import DataSetError
from codl.harness import data as hdata
from codl.harness.handoff import LoaderWorkerError, RingLoader
from codl.spec import DatasetSpec

BATCH = 4
SEED = 7
WORKERS = 2
BAD = 5  # the sample that fails, kills or hangs its worker
# Longer than any fault needs to surface; a hang ends here as a failure, not a blocked suite.
LIMIT_S = 45
# Names the ring could leave in /dev/shm if it named anything: multiprocessing's semaphores
# (sem.mp-*), its heaps (pym-*), torch's shared storages (torch_*), a POSIX shm of ours.
_RING_SHM = re.compile(r"^(sem\.mp-|pym-|torch_|psm_|codl)")


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ring-faults") / "jpeg"
    generate(DatasetSpec(samples=12, height=40, width=48), out)
    return out


class _HungError(Exception):
    """The test's own deadline passed: what it waited for hung."""


@pytest.fixture
def deadline() -> Iterator[None]:
    """SIGALRM after LIMIT_S raises in the test (also out of a semaphore wait). Forked workers
    inherit no pending alarm."""

    def expired(signum: int, frame: FrameType | None) -> None:
        raise _HungError(f"still waiting after {LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _ring_shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if _RING_SHM.match(n)}


def _shm_fds() -> set[str]:
    """/dev/shm files this process holds open or mapped."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        with_target = os.path.realpath(f"/proc/self/fd/{fd}")
        if with_target.startswith("/dev/shm/"):
            held.add(with_target)
    with open("/proc/self/maps") as maps:
        # An unlinked file (a semaphore, unlinked at birth) is named in no directory: not ours
        # to count; it goes with the last process that maps it.
        held |= {
            line.split(maxsplit=5)[-1].strip()
            for line in maps
            if "/dev/shm/" in line and not line.rstrip().endswith("(deleted)")
        }
    return held


@pytest.fixture
def nothing_left() -> Iterator[None]:
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this system")
    shm, fds = _ring_shm(), _shm_fds()
    yield
    assert _ring_shm() - shm == set(), "the ring left a segment in /dev/shm"
    assert _shm_fds() - fds == set(), "the ring left a /dev/shm file open or mapped"


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids: list[int], within_s: float = 20) -> None:
    end = time.monotonic() + within_s
    while not all(_gone(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    assert [p for p in pids if not _gone(p)] == [], "a loader worker outlived the fault"


class _Faulty(torch.utils.data.Dataset[tuple[torch.Tensor, int, np.ndarray]]):
    """The JPEG set, except that sample BAD, read in a worker (never in the rank), does
    ``fault``; a hang first leaves ``<marker>/<pid>`` so that a test knows who hangs."""

    def __init__(self, data: Path, fault: str, marker: Path, error: BaseException | None = None):
        self.inner = hdata.dataset_for("jpeg", data, 32)
        self.fault, self.marker, self.error = fault, marker, error
        self.rank = os.getpid()

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, np.ndarray]:
        if i == BAD and os.getpid() != self.rank:
            if self.fault == "raise":
                assert self.error is not None
                raise self.error
            if self.fault == "sys.exit":
                sys.exit(3)
            if self.fault == "os._exit":
                os._exit(3)
            if self.fault == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fault == "hang":
                (self.marker / str(os.getpid())).touch()
                time.sleep(3600)
        return self.inner[i]  # type: ignore[index,no-any-return]


def _ring(dataset: object, timeout: float = 0) -> RingLoader:
    """A started ring; the workers' seeds drawn from the rank's generator as in a clean run."""
    torch.manual_seed(SEED)
    loader = RingLoader(
        dataset,
        batch_size=BATCH,
        workers=WORKERS,
        prefetch_factor=2,
        generator=torch.Generator().manual_seed(SEED),
        timeout=timeout,
    )
    return iter(loader)


@pytest.fixture(scope="module")
def clean(jpegs: Path) -> list[hdata.Batch]:
    """What a run with no fault hands out: the reference every batch before a fault must match."""
    ring = _ring(hdata.dataset_for("jpeg", jpegs, 32))
    out = []
    try:
        for _ in range(9):
            b = next(ring)
            x, y = ring.to_device(b, torch.device("cpu"))
            out.append(hdata.Batch(x, y, b.items, b.collate))
    finally:
        ring.close()
    return out


def _drain(ring: RingLoader, clean: list[hdata.Batch], n: int = 9) -> int:
    """Take up to n batches, each checked against the clean run's; the number taken."""
    item = hdata.ITEM_COLUMNS.index("item")
    for k in range(n):
        b = next(ring)
        x, y = ring.to_device(b, torch.device("cpu"))
        want = clean[k]
        assert b.items[:, item].tolist() == want.items[:, item].tolist(), k
        assert torch.equal(x, want.inputs) and torch.equal(y, want.targets), k
    return n


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


def _worker_of(text: str, ring_pids: list[int]) -> tuple[int, int]:
    m = re.search(r"loader worker (\d+) \(pid (\d+)\)", text)
    assert m, text
    wid, pid = int(m[1]), int(m[2])
    assert ring_pids[wid] == pid, (text, ring_pids)
    return wid, pid


# -- 1. a worker SIGKILLed mid-epoch ------------------------------------------------------------
@pytest.mark.usefixtures("deadline", "nothing_left")
def test_a_worker_killed_while_the_rank_waits_for_it_is_named(
    jpegs: Path, tmp_path: Path, clean: list[hdata.Batch]
) -> None:
    ring = _ring(_Faulty(jpegs, "hang", tmp_path))
    pids = ring.worker_pids()
    killed: set[int] = set()
    done = threading.Event()

    def kill_the_hung() -> None:
        # Sample 5 comes in every pass, so both workers may hang on it: each one that does is
        # killed, the one the rank waits for among them.
        while not done.wait(0.1):
            for marker in tmp_path.iterdir():
                if int(marker.name) not in killed:
                    time.sleep(0.3)  # the rank is in next() by now
                    killed.add(int(marker.name))
                    os.kill(int(marker.name), signal.SIGKILL)

    killer = threading.Thread(target=kill_the_hung, daemon=True)
    killer.start()
    start = time.monotonic()
    try:
        with pytest.raises(LoaderWorkerError) as exc:
            _drain(ring, clean)
    finally:
        done.set()
        ring.close()
    killer.join(timeout=5)
    text = _one_line(exc)
    assert time.monotonic() - start < 15
    _, pid = _worker_of(text, pids)
    assert pid in killed
    assert re.search(
        rf"was killed by SIGKILL while reading sample {BAD} of batch (\d+), before it delivered "
        r"batch \1$",
        text,
    ), text
    _wait_gone(pids, within_s=0)


@pytest.mark.usefixtures("deadline", "nothing_left")
def test_a_worker_killed_while_the_rank_is_busy_is_named_at_its_next_batch(
    jpegs: Path, clean: list[hdata.Batch]
) -> None:
    ring = _ring(hdata.dataset_for("jpeg", jpegs, 32))
    pids = ring.worker_pids()
    taken = _drain(ring, clean, 2)
    # Killed while the rank computes: worker 1, which delivered batch 1, fills or has filled
    # the next of its batches.
    time.sleep(0.3)
    os.kill(pids[1], signal.SIGKILL)
    end = time.monotonic() + 10
    while psutil.Process(pids[1]).status() != psutil.STATUS_ZOMBIE and time.monotonic() < end:
        time.sleep(0.02)
    try:
        with pytest.raises(LoaderWorkerError) as exc:
            # What it delivered before it died is still good; then the loss is named.
            for k in range(taken, len(clean)):
                _drain_one(ring, clean, k)
    finally:
        ring.close()
    text = _one_line(exc)
    _worker_of(text, pids)
    assert re.fullmatch(
        rf"loader worker 1 \(pid {pids[1]}\) was killed by SIGKILL"
        r"( while reading sample \d+ of batch \d+,| while filling batch \d+,)? "
        r"before it delivered batch \d+",
        text,
    ), text
    _wait_gone(pids, within_s=0)


def _drain_one(ring: RingLoader, clean: list[hdata.Batch], k: int) -> None:
    item = hdata.ITEM_COLUMNS.index("item")
    b = next(ring)
    x, y = ring.to_device(b, torch.device("cpu"))
    assert b.items[:, item].tolist() == clean[k].items[:, item].tolist(), k
    assert torch.equal(x, clean[k].inputs) and torch.equal(y, clean[k].targets), k


# -- 3. a worker's own failure ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fault", "error", "kind", "says"),
    [
        (
            "raise",
            DataSetError("/data/x.jpg: not a decodable JPEG (truncated)"),
            DataSetError,
            r"failed while reading sample 5 of batch \d+: /data/x\.jpg: not a decodable JPEG",
        ),
        (
            "raise",
            ValueError("bad crop"),
            LoaderWorkerError,
            r"failed while reading sample 5 of batch \d+: ValueError: bad crop$",
        ),
        (
            "raise",
            ValueError("line one\nline two\n"),
            LoaderWorkerError,
            r"failed while reading sample 5 of batch \d+: ValueError: line one; line two$",
        ),
        ("raise", KeyError("k"), LoaderWorkerError, r"sample 5 of batch \d+: KeyError: 'k'$"),
        ("sys.exit", None, LoaderWorkerError, r"sample 5 of batch \d+: SystemExit: 3$"),
        (
            "os._exit",
            None,
            LoaderWorkerError,
            r"exited with status 3 while reading sample 5 of batch \d+, before it delivered",
        ),
        (
            "sigkill",
            None,
            LoaderWorkerError,
            r"was killed by SIGKILL while reading sample 5 of batch \d+, before it delivered",
        ),
    ],
    ids=[
        "data-set error",
        "other error",
        "multi-line error",
        "key error",
        "sys.exit",
        "os._exit",
        "killed itself",
    ],
)
@pytest.mark.usefixtures("deadline", "nothing_left")
def test_a_worker_failure_is_one_line_naming_worker_pid_and_sample(
    jpegs: Path,
    tmp_path: Path,
    clean: list[hdata.Batch],
    fault: str,
    error: BaseException | None,
    kind: type[Exception],
    says: str,
) -> None:
    ring = _ring(_Faulty(jpegs, fault, tmp_path, error))
    pids = ring.worker_pids()
    start = time.monotonic()
    try:
        with pytest.raises(kind) as exc:
            _drain(ring, clean)
        # The loader stays failed: the same error again, not a misleading later one.
        with pytest.raises(kind) as again:
            next(ring)
        assert str(again.value) == str(exc.value)
    finally:
        ring.close()
    assert time.monotonic() - start < 15
    text = _one_line(exc)
    _worker_of(text, pids)
    assert re.search(says, text), text
    _wait_gone(pids, within_s=0)


@pytest.mark.usefixtures("deadline", "nothing_left")
def test_a_failing_worker_init_fn_is_named(jpegs: Path) -> None:
    def init(wid: int) -> None:
        if wid == 1:
            raise RuntimeError("no CPU for worker 1")

    ring = RingLoader(
        hdata.dataset_for("jpeg", jpegs, 32),
        batch_size=BATCH,
        workers=WORKERS,
        prefetch_factor=2,
        generator=torch.Generator().manual_seed(SEED),
        worker_init_fn=init,
    )
    it = iter(ring)
    pids = it.worker_pids()
    try:
        with pytest.raises(LoaderWorkerError) as exc:
            for _ in range(4):
                it.to_device(next(it), torch.device("cpu"))
    finally:
        it.close()
    assert re.fullmatch(
        rf"loader worker 1 \(pid {pids[1]}\) failed while starting \(worker_init_fn\): "
        "RuntimeError: no CPU for worker 1",
        _one_line(exc),
    )
    _wait_gone(pids, within_s=0)


# -- 4. a worker that hangs ---------------------------------------------------------------------
@pytest.mark.usefixtures("deadline", "nothing_left")
def test_a_hung_worker_ends_in_the_loaders_timeout_and_is_killed_on_close(
    jpegs: Path, tmp_path: Path, clean: list[hdata.Batch]
) -> None:
    ring = _ring(_Faulty(jpegs, "hang", tmp_path), timeout=1.0)
    pids = ring.worker_pids()
    start = time.monotonic()
    try:
        with pytest.raises(LoaderWorkerError) as exc:
            _drain(ring, clean)
        waited = time.monotonic() - start
    finally:
        closing = time.monotonic()
        ring.close()
        closed_in = time.monotonic() - closing
    text = _one_line(exc)
    _, pid = _worker_of(text, pids)
    assert pid in [int(p.name) for p in tmp_path.iterdir()]
    assert re.search(
        rf"did not deliver batch \d+ within the loader's timeout of 1 s; it is still reading "
        rf"sample {BAD} of batch \d+",
        text,
    ), text
    assert waited < 10
    assert closed_in < 10  # the hung worker is killed, not waited for
    _wait_gone(pids, within_s=0)


@pytest.mark.usefixtures("nothing_left")
def test_without_a_timeout_a_hung_worker_is_waited_for_as_torchs_loader_waits(
    jpegs: Path, tmp_path: Path, clean: list[hdata.Batch]
) -> None:
    """timeout=0 (torch's default): the rank waits while the worker lives; a signal still
    gets it out of the wait, and close() still ends the worker."""
    ring = _ring(_Faulty(jpegs, "hang", tmp_path))
    pids = ring.worker_pids()

    def expired(signum: int, frame: FrameType | None) -> None:
        raise _HungError("interrupted")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, 3.0)
    try:
        with pytest.raises(_HungError):
            _drain(ring, clean)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        ring.close()
    _wait_gone(pids, within_s=0)


@pytest.mark.usefixtures("deadline")
def test_a_slot_never_given_back_is_an_error_not_a_hang(jpegs: Path) -> None:
    ring = _ring(hdata.dataset_for("jpeg", jpegs, 32))
    try:
        with pytest.raises(LoaderWorkerError, match="holds all 2 slots of loader worker 0"):
            for _ in range(WORKERS * 2 + 1):
                next(ring)  # never to_device(): no slot goes back
    finally:
        ring.close()


def test_a_negative_timeout_is_refused(jpegs: Path) -> None:
    with pytest.raises(LoaderWorkerError, match="timeout"):
        _ring(hdata.dataset_for("jpeg", jpegs, 32), timeout=-1)


# -- 2. the rank killed -------------------------------------------------------------------------
_RANK = textwrap.dedent(
    """
    import os, signal, sys, time, torch
    from codl.harness import data as hdata
    from codl.harness.handoff import RingLoader

    data, state, handler = sys.argv[1], sys.argv[2], sys.argv[3]
    rank = os.getpid()

    class Stuck(torch.utils.data.Dataset):
        # Workers never finish a batch: the rank waits in next(). The first read of a process
        # returns, so that the layout probe (one sample, in a child of the rank) lays out the ring.
        def __init__(self):
            self.inner = hdata.dataset_for("jpeg", data, 32)
            self.reads = 0
        def __len__(self):
            return len(self.inner)
        def __getitem__(self, i):
            self.reads += 1
            if os.getpid() != rank and self.reads > 1:
                time.sleep(3600)
            return self.inner[i]

    if handler == "raises":
        # As the runner's stop handler: the signal becomes an exception, close() runs.
        def stop(signum, frame):
            raise SystemExit(f"received {signal.Signals(signum).name}")
        signal.signal(signal.SIGTERM, stop)
    dataset = Stuck() if state == "waiting" else hdata.dataset_for("jpeg", data, 32)
    ring = iter(RingLoader(dataset, batch_size=4, workers=3, prefetch_factor=2,
                           generator=torch.Generator().manual_seed(0)))
    try:
        if state == "idle":
            ring.to_device(next(ring), torch.device("cpu"))
        print(" ".join(map(str, ring.worker_pids())), flush=True)
        if state == "waiting":
            next(ring)
        time.sleep(600)
    finally:
        ring.close()
    """
)


@pytest.mark.parametrize("state", ["idle", "waiting"])
@pytest.mark.parametrize(
    ("sig", "handler"),
    [(signal.SIGKILL, "default"), (signal.SIGTERM, "default"), (signal.SIGTERM, "raises")],
    ids=["SIGKILL", "SIGTERM", "SIGTERM-handled"],
)
@pytest.mark.usefixtures("nothing_left")
def test_no_worker_or_shared_memory_survives_a_killed_rank(
    jpegs: Path, state: str, sig: signal.Signals, handler: str
) -> None:
    rank = subprocess.Popen(
        [sys.executable, "-c", _RANK, str(jpegs), state, handler],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert rank.stdout is not None
        line = rank.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 3 and not any(_gone(p) for p in pids), line
        time.sleep(0.5)  # in next(), or asleep
        start = time.monotonic()
        rank.send_signal(sig)
        code = rank.wait(timeout=30)
        took = time.monotonic() - start
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait(timeout=30)
    assert took < 15
    _, err = rank.communicate(timeout=30)
    if handler == "raises":
        assert code == 1 and err.strip().endswith("received SIGTERM"), err[-2000:]
    else:
        assert code == -sig
    _wait_gone(pids)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.usefixtures("deadline")
def test_slots_whose_copies_are_in_flight_are_waited_for_not_deadlocked_on(
    jpegs: Path, clean: list[hdata.Batch]
) -> None:
    """A caller that never synchronises: every slot of a worker is still being copied when the
    rank needs that worker's next batch. The rank waits for the oldest copy and gives its slot
    back, rather than wait forever for a worker that waits for a slot."""
    torch.manual_seed(SEED)
    ring = RingLoader(
        hdata.dataset_for("jpeg", jpegs, 32),
        batch_size=BATCH,
        workers=WORKERS,
        prefetch_factor=2,
        generator=torch.Generator().manual_seed(SEED),
        page_lock=True,
        device=torch.device("cuda"),
    )
    it = iter(ring)
    got = []
    try:
        for _ in range(WORKERS * 2 + 3):
            b = next(it)
            with torch.cuda.stream(ring._stream):
                torch.cuda._sleep(200_000_000)  # ~0.1 s: the copy queued after it stays in flight
            got.append(it.to_device(b, torch.device("cuda")))
        torch.cuda.synchronize()
    finally:
        it.close()
    for k, (x, y) in enumerate(got):
        assert torch.equal(x.cpu(), clean[k].inputs), k
        assert torch.equal(y.cpu(), clean[k].targets), k
