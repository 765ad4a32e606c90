"""CPU-set policies: pure placements on made-up machines, then real pinning on this one."""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from codl.errors import PlacementError
from codl.pinning import (
    LAUNCH_ROLES,
    Placement,
    Role,
    ThreadRow,
    apply_threads,
    apply_worker,
    classify_thread,
    cpulist,
    discover_threads,
    gpu_local_cpus,
    mismatches,
    normalize_pci_bus_id,
    parse_cpulist,
    pci_local_cpus,
    plan,
    plan_for_process,
    plan_rows,
    rank_share,
    record_threads,
)
from codl.spec import PinningSpec, Policy

CPU_SETS = {
    "2": frozenset(range(2)),
    "16": frozenset(range(16)),
    "64": frozenset(range(64)),
    "evens": frozenset(range(0, 32, 2)),
    "ragged": frozenset({1, 5, 6, 7, 12}),
}
# (machine, local ranks) pairs where every rank gets at least one CPU
SPLITS = [
    pytest.param(cpus, ranks, id=f"{name}-{ranks}ranks")
    for name, cpus in CPU_SETS.items()
    for ranks in (1, 2, 3, 4)
    if ranks <= len(cpus)
]
PINNING_POLICIES = [Policy.SHARED, Policy.ISOLATED, Policy.SPREAD, Policy.NUMA]


def _possible(policy: Policy, share: int, k: int, workers: int) -> bool:
    """When a request can be met, stated independently of the implementation."""
    if k > share:
        return False
    if policy in {Policy.ISOLATED, Policy.SPREAD}:
        return workers == 0 or share > k
    return True


# ---------------------------------------------------------------------------------------------
# Rank shares


@pytest.mark.parametrize(("cpus", "local_ranks"), SPLITS)
def test_rank_shares_are_disjoint_contiguous_and_cover_the_allowed_set(
    cpus: frozenset[int], local_ranks: int
) -> None:
    shares = [rank_share(cpus, local_ranks, r) for r in range(local_ranks)]
    assert frozenset().union(*shares) == cpus
    assert sum(len(s) for s in shares) == len(cpus)  # disjoint
    # contiguous chunks of the sorted set, in rank order, remainder to the first ranks
    assert [c for s in shares for c in sorted(s)] == sorted(cpus)
    sizes = [len(s) for s in shares]
    assert sizes == sorted(sizes, reverse=True)
    assert max(sizes) - min(sizes) <= 1


def test_rank_share_spreads_the_remainder_to_the_first_ranks() -> None:
    ragged = CPU_SETS["ragged"]  # 5 CPUs, 2 ranks: 3 + 2
    assert rank_share(ragged, 2, 0) == {1, 5, 6}
    assert rank_share(ragged, 2, 1) == {7, 12}


@pytest.mark.parametrize(
    ("local_ranks", "local_rank", "needle"),
    [
        (4, 0, "4 local ranks but the job has only 2 allowed CPU(s) {0,1}"),
        (2, 2, "0..1"),
        (0, 0, ""),
    ],
)
def test_rank_share_rejects_impossible_splits(
    local_ranks: int, local_rank: int, needle: str
) -> None:
    with pytest.raises(PlacementError, match="rank split") as err:
        rank_share(CPU_SETS["2"], local_ranks, local_rank)
    assert needle in str(err.value)


# ---------------------------------------------------------------------------------------------
# Policies: properties over many machines


@pytest.mark.parametrize(("cpus", "local_ranks"), SPLITS)
@pytest.mark.parametrize("policy", PINNING_POLICIES)
@pytest.mark.parametrize("launch_cores", [1, 2, 4])
@pytest.mark.parametrize("workers", [0, 1, 3, 8])
def test_policy_properties(
    cpus: frozenset[int], local_ranks: int, policy: Policy, launch_cores: int, workers: int
) -> None:
    spec = PinningSpec(policy=policy, launch_cores=launch_cores)
    for rank in range(local_ranks):
        share = rank_share(cpus, local_ranks, rank)
        # numa here sees every CPU as GPU-local, so it must behave like `shared` on the share
        gpu_cpus = cpus if policy is Policy.NUMA else None
        kwargs: dict[str, Any] = dict(
            allowed=cpus, workers=workers, local_ranks=local_ranks, local_rank=rank, gpu=rank
        )
        if not _possible(policy, len(share), launch_cores, workers):
            with pytest.raises(PlacementError, match=f"launch_cores={launch_cores}"):
                plan(spec, gpu_cpus=gpu_cpus, **kwargs)
            continue
        p = plan(spec, gpu_cpus=gpu_cpus, **kwargs)
        assert p.launch is not None
        assert p.workers is not None
        assert p.policy is policy
        assert p.allowed == cpus
        assert p.rank_cpus == share
        assert len(p.workers) == workers
        assert p.launch == frozenset(sorted(share)[:launch_cores])
        assert p.launch <= share <= cpus
        for w in p.workers:
            assert w <= share <= cpus
            assert w
        rest = share - p.launch
        if policy in {Policy.SHARED, Policy.NUMA}:
            assert all(w == share for w in p.workers)
            assert all(p.launch <= w for w in p.workers)  # workers can run on launch cores
        elif policy is Policy.ISOLATED:
            assert all(w == rest for w in p.workers)
            assert all(not (w & p.launch) for w in p.workers)
        elif policy is Policy.SPREAD:
            assert all(len(w) == 1 for w in p.workers)
            assert all(not (w & p.launch) for w in p.workers)
            used = [next(iter(w)) for w in p.workers]
            assert used == [sorted(rest)[i % len(rest)] for i in range(workers)]
            if workers <= len(rest):
                assert len(set(used)) == workers
        oversubscribed = policy is Policy.SPREAD and workers > len(rest)
        assert any("oversubscribed" in w for w in p.warnings) == oversubscribed
        if not oversubscribed:
            assert p.warnings == ()


@pytest.mark.parametrize("cpus", CPU_SETS.values(), ids=CPU_SETS.keys())
@pytest.mark.parametrize("local_ranks", [1, 4])
def test_policy_none_changes_nothing_whatever_the_split(
    cpus: frozenset[int], local_ranks: int
) -> None:
    p = plan(
        PinningSpec(policy=Policy.NONE, launch_cores=64),
        allowed=cpus,
        workers=3,
        local_ranks=local_ranks,
        local_rank=local_ranks - 1,
    )
    assert (p.launch, p.workers, p.rank_cpus, p.warnings) == (None, None, cpus, ())
    assert p.cpus_for(Role.LAUNCH) is None
    assert p.cpus_for(Role.LOADER, 0) is None


def test_ranks_of_a_node_get_disjoint_launch_and_worker_cpus() -> None:
    cpus = CPU_SETS["64"]
    placements = [
        plan(
            PinningSpec(policy=Policy.ISOLATED, launch_cores=2),
            allowed=cpus,
            workers=4,
            local_ranks=4,
            local_rank=r,
        )
        for r in range(4)
    ]
    used = [(p.launch or frozenset()).union(*(p.workers or ())) for p in placements]
    assert all(a.isdisjoint(b) for i, a in enumerate(used) for b in used[i + 1 :])
    assert frozenset().union(*used) == cpus
    assert [min(p.launch or ()) for p in placements] == [0, 16, 32, 48]


def test_spread_wraps_around_and_says_so() -> None:
    p = plan(PinningSpec(policy=Policy.SPREAD), allowed=CPU_SETS["ragged"], workers=6)
    assert p.launch == frozenset({1})
    assert p.workers == tuple(frozenset({c}) for c in [5, 6, 7, 12, 5, 6])
    assert len(p.warnings) == 1
    assert "oversubscribed: 6 workers on 4 cores" in p.warnings[0]


# ---------------------------------------------------------------------------------------------
# Policies: impossible requests


def test_isolated_error_names_the_numbers() -> None:
    with pytest.raises(PlacementError) as err:
        plan(
            PinningSpec(policy=Policy.ISOLATED, launch_cores=4),
            allowed=range(6),
            workers=2,
            local_ranks=2,
            local_rank=0,
        )
    assert str(err.value) == (
        "isolated: launch_cores=4 but rank 0 of 2 has only 3 CPUs {0,1,2} of the job's 6 allowed"
    )


@pytest.mark.parametrize("policy", [Policy.ISOLATED, Policy.SPREAD])
def test_no_core_left_for_workers_is_an_error_only_with_workers(policy: Policy) -> None:
    spec = PinningSpec(policy=policy, launch_cores=3)
    with pytest.raises(PlacementError, match=r"leaving no CPU for 2 loader worker\(s\)") as err:
        plan(spec, allowed=CPU_SETS["ragged"], workers=2, local_ranks=2, local_rank=0)
    assert "launch_cores=3 but rank 0 of 2 has only 3 CPUs {1,5,6}" in str(err.value)
    p = plan(spec, allowed=CPU_SETS["ragged"], workers=0, local_ranks=2, local_rank=0)
    assert (p.launch, p.workers) == (frozenset({1, 5, 6}), ())


def test_shared_lets_workers_share_all_launch_cores() -> None:
    p = plan(PinningSpec(policy=Policy.SHARED, launch_cores=2), allowed=CPU_SETS["2"], workers=2)
    assert p.launch == frozenset({0, 1})
    assert p.workers == (frozenset({0, 1}),) * 2


@pytest.mark.parametrize("policy", list(Policy))
def test_bad_inputs_are_placement_errors(policy: Policy) -> None:
    with pytest.raises(PlacementError, match="workers=-1"):
        plan(PinningSpec(policy=policy), allowed=range(4), workers=-1)
    with pytest.raises(PlacementError, match="launch_cores=0"):
        plan(PinningSpec(policy=policy, launch_cores=0), allowed=range(4), workers=1)
    with pytest.raises(PlacementError, match="empty"):
        plan(PinningSpec(policy=policy), allowed=(), workers=1)


# ---------------------------------------------------------------------------------------------
# numa


def test_numa_uses_the_gpu_local_part_of_the_share() -> None:
    # two sockets of 16 CPUs with SMT siblings 32-63; the rank's GPU hangs off socket 1
    socket1 = frozenset(range(16, 32)) | frozenset(range(48, 64))
    p = plan(
        PinningSpec(policy=Policy.NUMA, launch_cores=2),
        allowed=range(64),
        workers=3,
        gpu=1,
        gpu_cpus=socket1,
    )
    assert p.launch == frozenset({16, 17})
    assert p.workers == (socket1,) * 3
    assert p.rank_cpus == frozenset(range(64))
    assert p.warnings == ()


def test_numa_with_several_ranks_intersects_with_the_share() -> None:
    socket0 = frozenset(range(32))
    p = plan(
        PinningSpec(policy=Policy.NUMA),
        allowed=range(64),
        workers=1,
        local_ranks=4,
        local_rank=1,
        gpu=1,
        gpu_cpus=socket0 | {40},
    )
    assert p.launch == frozenset({16})
    assert p.workers == (frozenset(range(16, 32)),)


@pytest.mark.parametrize(
    ("gpu", "gpu_cpus", "warning"),
    [
        (0, None, "numa: topology unknown for GPU 0; fell back to isolated"),
        (None, None, "numa: topology unknown for rank 0 (no GPU: CPU run); fell back to isolated"),
        (3, frozenset({40, 41}), "numa: GPU 3's local CPUs {40,41} miss rank 0's share"),
    ],
)
def test_numa_falls_back_to_isolated_with_a_warning(
    gpu: int | None, gpu_cpus: frozenset[int] | None, warning: str
) -> None:
    spec = PinningSpec(policy=Policy.NUMA)
    p = plan(spec, allowed=range(16), workers=2, gpu=gpu, gpu_cpus=gpu_cpus)
    isolated = plan(PinningSpec(policy=Policy.ISOLATED), allowed=range(16), workers=2)
    assert p.policy is Policy.NUMA  # what was asked for, the warning says what happened
    assert (p.launch, p.workers) == (isolated.launch, isolated.workers)
    assert len(p.warnings) == 1
    assert p.warnings[0].startswith(warning)


def test_numa_fallback_that_is_impossible_says_both() -> None:
    with pytest.raises(PlacementError, match="fell back to isolated, and isolated is impossible"):
        plan(PinningSpec(policy=Policy.NUMA, launch_cores=2), allowed=range(2), workers=1, gpu=0)


def test_numa_with_too_few_local_cpus_for_the_launch_cores() -> None:
    with pytest.raises(PlacementError, match=r"launch_cores=3 but only 2 CPUs \{4,5\}"):
        plan(
            PinningSpec(policy=Policy.NUMA, launch_cores=3),
            allowed=range(8),
            workers=1,
            gpu=0,
            gpu_cpus=frozenset({4, 5, 30}),
        )


def _fake_sysfs(root: Path, bus_id: str, *, local: str, node: str, online: str | None) -> Path:
    dev = root / "bus" / "pci" / "devices" / bus_id
    dev.mkdir(parents=True)
    (dev / "local_cpulist").write_text(local + "\n")
    (dev / "numa_node").write_text(node + "\n")
    if online is not None:
        nodes = root / "devices" / "system" / "node"
        nodes.mkdir(parents=True)
        (nodes / "online").write_text(online + "\n")
    return root


@pytest.mark.parametrize(
    ("local", "node", "online", "expected"),
    [
        ("16-31,48-63", "1", "0-1", frozenset(range(16, 32)) | frozenset(range(48, 64))),
        ("0-7", "-1", "0", frozenset(range(8))),  # single node, firmware silent: all local
        ("0-63", "-1", "0-1", None),  # several nodes, firmware silent: unknown
        ("0-63", "-1", None, None),
        ("", "0", "0", None),
    ],
)
def test_pci_local_cpus_reads_sysfs(
    tmp_path: Path, local: str, node: str, online: str | None, expected: frozenset[int] | None
) -> None:
    sysfs = _fake_sysfs(
        tmp_path / "sys dir ü", "0000:3b:00.0", local=local, node=node, online=online
    )
    assert pci_local_cpus("00000000:3B:00.0", sysfs=sysfs) == expected
    assert pci_local_cpus("0000:5e:00.0", sysfs=sysfs) is None


@pytest.mark.parametrize(
    ("raw", "sysfs_name"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:af:00.1", "0000:af:00.1"),
        ("1:02:03.4", "0001:02:03.4"),
    ],
)
def test_normalize_pci_bus_id(raw: str, sysfs_name: str) -> None:
    assert normalize_pci_bus_id(raw) == sysfs_name


def test_normalize_pci_bus_id_rejects_garbage() -> None:
    with pytest.raises(ValueError, match=r"DOMAIN:BUS:DEVICE\.FUNCTION"):
        normalize_pci_bus_id("GPU-1234")


def test_gpu_local_cpus_is_unknown_without_that_gpu() -> None:
    assert gpu_local_cpus(10_000) is None


# ---------------------------------------------------------------------------------------------
# cpulist


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", frozenset()),
        ("0", frozenset({0})),
        ("0-3,8,10-11", frozenset({0, 1, 2, 3, 8, 10, 11})),
        ("0-1", frozenset({0, 1})),
        ("1,3,5", frozenset({1, 3, 5})),
        ("1,5-7,12", CPU_SETS["ragged"]),
        ("0-63", CPU_SETS["64"]),
        ("1023", frozenset({1023})),
    ],
)
def test_cpulist_round_trip(text: str, cpus: frozenset[int]) -> None:
    assert cpulist(cpus) == text
    assert parse_cpulist(text) == cpus
    assert parse_cpulist(text + "\n") == cpus  # as read from sysfs
    assert parse_cpulist(cpulist(cpus)) == cpus


@pytest.mark.parametrize("cpus", CPU_SETS.values(), ids=CPU_SETS.keys())
def test_cpulist_round_trip_on_the_test_machines(cpus: frozenset[int]) -> None:
    assert parse_cpulist(cpulist(cpus)) == cpus
    assert cpulist(list(cpus) + list(cpus)) == cpulist(cpus)  # duplicates and order don't matter


def test_parse_cpulist_stride_form() -> None:
    assert parse_cpulist("0-15:2/4") == {0, 1, 4, 5, 8, 9, 12, 13}
    assert parse_cpulist(" 2, 4-5 ") == {2, 4, 5}


@pytest.mark.parametrize("text", ["a", "3-1", "1,,2", "0-7:0/4", "0-7:5/4", "-1", "0-3:1/0"])
def test_parse_cpulist_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="cpulist"):
        parse_cpulist(text)


# ---------------------------------------------------------------------------------------------
# Recording the placement


def test_placement_pickles_and_serializes() -> None:
    p = plan(PinningSpec(policy=Policy.SPREAD), allowed=CPU_SETS["ragged"], workers=5)
    assert pickle.loads(pickle.dumps(p)) == p
    assert p.to_dict() == {
        "policy": "spread",
        "allowed": "1,5-7,12",
        "rank_cpus": "1,5-7,12",
        "launch": "1",
        "workers": ["5", "6", "7", "12", "5"],
        "warnings": list(p.warnings),
    }
    rows = plan_rows(p)
    assert [(r.role, r.worker_id, r.cpus) for r in rows[:4]] == [
        ("allowed", -1, "1,5-7,12"),
        ("rank", -1, "1,5-7,12"),
        ("launch", -1, "1"),
        ("other", -1, "1,5-7,12"),
    ]
    assert [(r.worker_id, r.cpus) for r in rows[4:]] == [
        (0, "5"),
        (1, "6"),
        (2, "7"),
        (3, "12"),
        (4, "5"),
    ]


def test_placement_for_an_unplanned_worker_is_an_error() -> None:
    p = plan(PinningSpec(policy=Policy.ISOLATED), allowed=range(4), workers=2)
    with pytest.raises(PlacementError, match="loader worker 2; the plan was made for 2"):
        p.cpus_for(Role.LOADER, 2)


def test_mismatches_reports_planned_vs_actual() -> None:
    rows = [
        ThreadRow(tid=7, pid=7, role=Role.LAUNCH, name="python", cpus_planned="0", cpus_actual="0"),
        ThreadRow(
            tid=8,
            pid=7,
            role=Role.COMM,
            name="pt_nccl_watchdg",
            cpus_planned="0",
            cpus_actual="0-1",
        ),
        ThreadRow(tid=9, pid=7, role=Role.OTHER, name="python", cpus_planned="", cpus_actual="0-1"),
    ]
    assert mismatches(rows) == ["comm thread 8 ('pt_nccl_watchdg') of pid 7: planned 0, actual 0-1"]


# ---------------------------------------------------------------------------------------------
# Threads on this machine


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("pt_autograd_0", Role.AUTOGRAD),
        ("pt_autograd_7", Role.AUTOGRAD),
        ("pt_nccl_watchdg", Role.COMM),
        ("pt_nccl_heartbt", Role.COMM),
        ("pt_nccl_gil_chk", Role.COMM),
        ("pt_gloo_runloop", Role.COMM),
        ("pt_tcpstore_uv", Role.COMM),
        ("NCCL UDS Servic", Role.COMM),
        ("NCCL RAS", Role.COMM),
        ("pt_tcpstore", Role.COMM),
        ("NCCL Progress 3", Role.COMM),
        ("NCCL Service  0", Role.COMM),
        ("my_gloo_thread", Role.COMM),
        ("ProcessGroupX", Role.COMM),
        ("python", Role.OTHER),
        ("pt_thread_pool", Role.OTHER),
        ("cuda-EvtHandlr", Role.OTHER),
        ("cuda00001800007", Role.OTHER),
        ("pt_data_pin", Role.PIN_MEMORY),
    ],
)
def test_classify_thread(name: str, role: Role) -> None:
    assert classify_thread(name, is_main=False) is role
    assert classify_thread(name, is_main=True) is Role.LAUNCH
    assert classify_thread(name, is_main=False, is_pin_memory=True) is Role.PIN_MEMORY


class _Threads:
    """Helper threads that idle until released; named natively through /proc like C++ does."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, native_name: str | None = None, *, pin_memory: bool = False) -> int:
        ready = threading.Event()

        def _pin_memory_loop() -> None:  # named like DataLoader's target on purpose
            ready.set()
            self.stop.wait()

        def idle() -> None:
            ready.set()
            self.stop.wait()

        t = threading.Thread(target=_pin_memory_loop if pin_memory else idle, daemon=True)
        t.start()
        ready.wait()
        assert t.native_id is not None
        if native_name is not None:
            Path(f"/proc/self/task/{t.native_id}/comm").write_text(native_name)
        self.threads.append(t)
        return t.native_id

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


@pytest.fixture
def helper_threads() -> Iterator[_Threads]:
    threads = _Threads()
    yield threads
    threads.join()


@pytest.fixture
def restore_masks() -> Iterator[None]:
    """Give every thread of the test process its mask back, whatever the test pinned."""
    before = {t.tid: os.sched_getaffinity(t.tid) for t in discover_threads()}
    yield
    for tid, mask in before.items():
        with contextlib.suppress(ProcessLookupError):  # the thread has exited
            os.sched_setaffinity(tid, mask)
    os.sched_setaffinity(0, before[os.getpid()])


def test_discover_threads_finds_the_roles(helper_threads: _Threads) -> None:
    autograd = helper_threads.start("pt_autograd_0")
    comm = helper_threads.start("pt_nccl_watchdg")
    pinner = helper_threads.start(pin_memory=True)
    other = helper_threads.start()
    roles = {t.tid: t for t in discover_threads()}
    main = roles[os.getpid()]
    assert main.role is Role.LAUNCH
    assert main.pid == os.getpid()
    assert roles[autograd].role is Role.AUTOGRAD
    assert roles[comm].role is Role.COMM
    assert roles[comm].name == "pt_nccl_watchdg"
    assert roles[pinner].role is Role.PIN_MEMORY
    assert roles[other].role is Role.OTHER
    assert all(t.role is Role.LOADER for t in discover_threads(os.getpid(), loader=True))


def test_discover_threads_of_a_missing_process() -> None:
    with pytest.raises(ProcessLookupError):
        discover_threads(2**22 + 12345)


def _this_machine() -> frozenset[int]:
    allowed = frozenset(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs at least 2 allowed CPUs")
    return allowed


@pytest.mark.usefixtures("restore_masks")
def test_apply_threads_pins_launch_roles_and_keeps_others_in_the_share(
    helper_threads: _Threads,
) -> None:
    allowed = _this_machine()
    autograd = helper_threads.start("pt_autograd_0")
    other = helper_threads.start()
    p = plan(PinningSpec(policy=Policy.ISOLATED), allowed=allowed, workers=1)
    assert p.launch == frozenset({min(allowed)})  # {0} on most machines
    rows = apply_threads(p)
    assert os.sched_getaffinity(0) == p.launch  # the calling (main) thread
    assert os.sched_getaffinity(autograd) == p.launch
    assert os.sched_getaffinity(other) == allowed
    assert mismatches(rows) == []
    by_tid = {r.tid: r for r in rows}
    assert by_tid[os.getpid()].cpus_actual == cpulist(p.launch)
    assert by_tid[os.getpid()].role is Role.LAUNCH
    assert by_tid[other].cpus_planned == cpulist(allowed)
    # a thread created now inherits the launch mask from the main thread; re-applying (as after
    # step 0) moves it to the share and changes nothing else
    late = helper_threads.start()
    assert os.sched_getaffinity(late) == p.launch
    again = apply_threads(p)
    assert os.sched_getaffinity(late) == allowed
    assert mismatches(again) == []
    assert [r for r in again if r.tid != late] == rows


@pytest.mark.usefixtures("restore_masks")
def test_apply_threads_never_widens_and_reports_drift() -> None:
    allowed = _this_machine()
    p = plan(PinningSpec(policy=Policy.SHARED), allowed=allowed, workers=0)
    apply_threads(p)
    os.sched_setaffinity(0, allowed)  # somebody undoes the pinning
    rows = record_threads(p)
    assert mismatches(rows) == [
        f"launch thread {os.getpid()} ({rows[0].name!r}) of pid {os.getpid()}: "
        f"planned {cpulist(p.launch or ())}, actual {cpulist(allowed)}"
    ]
    outside = Placement(
        policy=Policy.SHARED,
        allowed=frozenset({min(allowed)}),
        rank_cpus=allowed,
        launch=frozenset({max(allowed) + 1000}),
        workers=(),
    )
    with pytest.raises(PlacementError, match="outside the job's allowed"):
        apply_threads(outside)


@pytest.mark.usefixtures("restore_masks")
def test_policy_none_only_records() -> None:
    before = os.sched_getaffinity(0)
    p = plan(PinningSpec(policy=Policy.NONE), allowed=before, workers=2)
    rows = apply_threads(p)
    assert os.sched_getaffinity(0) == before
    assert all(r.cpus_planned == "" for r in rows)
    assert {r.cpus_actual for r in rows if r.tid == os.getpid()} == {cpulist(before)}
    assert mismatches(rows) == []


def test_plan_for_process_uses_the_current_mask() -> None:
    p = plan_for_process(PinningSpec(policy=Policy.NUMA), workers=0, gpu=None)
    assert p.allowed == frozenset(os.sched_getaffinity(0))
    assert p.warnings and "topology unknown" in p.warnings[0]


# ---------------------------------------------------------------------------------------------
# Loader workers in real child processes


def _child(placement: Placement, worker_id: int, queue: Any, done: Any) -> None:
    rows = apply_worker(placement, worker_id)
    Path("/proc/self/comm").write_text("pt_data_worker")  # as DataLoader's _worker_loop does
    queue.put((rows, frozenset(os.sched_getaffinity(0))))
    done.wait(60)  # stay alive while the parent records this worker by PID


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_child_process_applies_its_worker_placement(method: str) -> None:
    allowed = _this_machine()
    p = plan(PinningSpec(policy=Policy.SPREAD), allowed=allowed, workers=2)
    ctx: Any = multiprocessing.get_context(method)  # BaseContext's stubs lack Process
    queue, done = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_child, args=(p, 1, queue, done))
    child.start()
    try:
        rows, mask = queue.get(timeout=60)
        assert p.workers is not None
        assert mask == p.workers[1]
        assert rows
        assert all(r.role is Role.LOADER and r.pid == child.pid for r in rows)
        assert mismatches(rows) == []
        # seen from the rank process: a worker by its name alone, planned once its id is given
        assert {t.role for t in discover_threads(child.pid)} == {Role.LOADER}
        unplanned = record_threads(p, child.pid)
        assert {r.cpus_planned for r in unplanned} == {""}
        recorded = record_threads(p, child.pid, worker_id=1)
        assert {r.cpus_actual for r in recorded} == {cpulist(p.workers[1])}
        assert mismatches(recorded) == []
        if p.workers[0] != p.workers[1]:  # on 2 CPUs both workers share the one worker core
            assert mismatches(record_threads(p, child.pid, worker_id=0))
    finally:
        done.set()
        child.join(timeout=60)
    assert child.exitcode == 0
    assert Role.LOADER not in LAUNCH_ROLES


class _Masks:
    """A data set whose items are the mask of the worker that loads them."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> str:
        return cpulist(os.sched_getaffinity(0))


def test_dataloader_workers_are_pinned_through_worker_init_fn() -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    allowed = _this_machine()
    p = plan(PinningSpec(policy=Policy.ISOLATED), allowed=allowed, workers=2)
    loader = torch_data.DataLoader(
        _Masks(),
        batch_size=None,
        num_workers=2,
        worker_init_fn=functools.partial(apply_worker, p),
    )
    assert p.workers is not None
    assert set(loader) == {cpulist(p.workers[0])}
