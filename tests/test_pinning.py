"""CPU-set policies: pure placements on made-up machines, then real pinning on this one."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import multiprocessing
import os
import pickle
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from codl.errors import PlacementError
from codl.pinning import (
    HELPER_ROLES,
    LAUNCH_ROLES,
    Placement,
    Role,
    ThreadRow,
    apply_threads,
    apply_worker,
    classify_thread,
    cpulist,
    crowded,
    discover_threads,
    gpu_local_cpus,
    launch_need,
    mismatches,
    normalize_pci_bus_id,
    parse_cpulist,
    pci_local_cpus,
    plan,
    plan_for_process,
    plan_rows,
    rank_share,
    record_threads,
    roles_for,
)
from codl.spec import (
    Backend,
    DeviceKind,
    LayoutSpec,
    LoaderSpec,
    Mode,
    PinningSpec,
    Policy,
    RolePlace,
    RunSpec,
)

CPU_SETS = {
    "1": frozenset({3}),
    "2": frozenset(range(2)),
    "4": frozenset(range(4)),
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
PINNING_POLICIES = [p for p in Policy if p is not Policy.NONE]
# Helper roles a rank may have: none (CPU, one rank), autograd (CUDA compute), + pin-memory
# (a CUDA loader with pin_memory), all (+ comm: several ranks), comm alone (CPU, several ranks).
ROLE_SETS = {
    "none": frozenset(),
    "autograd": frozenset({Role.AUTOGRAD}),
    "autograd+pin": frozenset({Role.AUTOGRAD, Role.PIN_MEMORY}),
    "all": frozenset(HELPER_ROLES),
    "comm": frozenset({Role.COMM}),
}
# How the helpers are placed: pinning.autograd / pin_memory / comm.
PLACES: dict[str, dict[str, RolePlace]] = {
    "own": {},
    "beside-main": dict.fromkeys(("autograd", "pin_memory", "comm"), RolePlace.MAIN),
    "with-loader": dict.fromkeys(("autograd", "pin_memory", "comm"), RolePlace.LOADER),
    "mixed": {"autograd": RolePlace.MAIN, "pin_memory": RolePlace.LOADER, "comm": RolePlace.OWN},
}
LAUNCH_CORES: list[int | Literal["auto"]] = ["auto", 1, 2, 4]
WORKERS = (0, 1, 3, 8)


def _place_of(spec: PinningSpec, role: Role) -> RolePlace:
    """Where ``role`` is asked to go, stated from the policy table (not from the code)."""
    if spec.policy is Policy.ISOLATED_MAIN:
        return RolePlace.LOADER
    return RolePlace(getattr(spec, role.value))


def _impossible(
    spec: PinningSpec, share: frozenset[int], roles: frozenset[Role], workers: int
) -> str | None:
    """The message fragment an impossible request must raise with; ``None`` if it can be met.

    Stated from the rules of the docstring table, independently of how plan() is written.
    """
    own = [r for r in roles if _place_of(spec, r) is RolePlace.OWN]
    need = 1 + len(own)
    k = need if spec.launch_cores == "auto" else int(spec.launch_cores)
    if k < need:
        return f"launch_cores={k} is too few for this run's launch roles"
    if k > len(share):
        return f"only {len(share)} CPU"
    rest = len(share) - k
    loader_cpus = len(share) if spec.policy in {Policy.SHARED, Policy.NUMA} else rest
    with_loader = any(_place_of(spec, r) is RolePlace.LOADER for r in roles)
    if loader_cpus == 0 and (workers > 0 or with_loader):
        return "leaving no CPU for"
    return None


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
# Policies: every policy x helper roles x local ranks x machine


@pytest.mark.parametrize("cpus", CPU_SETS.values(), ids=CPU_SETS.keys())
@pytest.mark.parametrize("local_ranks", [1, 2, 4])
@pytest.mark.parametrize("roles", ROLE_SETS.values(), ids=ROLE_SETS.keys())
@pytest.mark.parametrize("policy", PINNING_POLICIES)
def test_policy_places_every_role(
    cpus: frozenset[int], local_ranks: int, roles: frozenset[Role], policy: Policy
) -> None:
    if local_ranks > len(cpus):
        with pytest.raises(PlacementError, match=f"{local_ranks} local ranks but the job"):
            plan(PinningSpec(policy=policy), allowed=cpus, workers=1, local_ranks=local_ranks)
        return
    for rank, places, launch_cores, workers in itertools.product(
        range(local_ranks), PLACES.values(), LAUNCH_CORES, WORKERS
    ):
        spec = PinningSpec(policy=policy, launch_cores=launch_cores, **places)
        share = rank_share(cpus, local_ranks, rank)
        # numa here sees every CPU as GPU-local: on the share it must place like `shared`
        kwargs: dict[str, Any] = dict(
            allowed=cpus,
            workers=workers,
            roles=roles,
            local_ranks=local_ranks,
            local_rank=rank,
            gpu=rank,
            gpu_cpus=cpus if policy is Policy.NUMA else None,
        )
        case = f"{spec} rank {rank} workers {workers}"
        needle = _impossible(spec, share, roles, workers)
        if needle is not None:
            with pytest.raises(PlacementError) as err:
                plan(spec, **kwargs)
            message = str(err.value)
            assert message.startswith(f"{policy.value}: launch_cores="), (case, message)
            assert needle in message, (case, message)
            assert re.search(r"\d", message.split(":", 1)[1]), message  # the numbers are there
            continue
        p = plan(spec, **kwargs)
        _check_placement(p, spec, cpus, share, roles, workers, case)


def _check_placement(
    p: Placement,
    spec: PinningSpec,
    cpus: frozenset[int],
    share: frozenset[int],
    roles: frozenset[Role],
    workers: int,
    case: str,
) -> None:
    policy = spec.policy
    assert (p.policy, p.allowed, p.rank_cpus, p.roles) == (policy, cpus, share, roles), case
    assert p.launch is not None and p.main is not None and p.other is not None, case
    assert p.workers is not None and len(p.workers) == workers, case
    own = [r for r in HELPER_ROLES if r in roles and _place_of(spec, r) is RolePlace.OWN]
    size = 1 + len(own) if spec.launch_cores == "auto" else spec.launch_cores
    ordered = sorted(share)
    # the launch set: the first CPUs of the share, the main thread alone on the first
    assert p.launch == frozenset(ordered[:size]), case
    assert p.main == frozenset(ordered[:1]), case
    rest = share - p.launch
    loader_cpus = share if policy in {Policy.SHARED, Policy.NUMA} else rest
    own_cpus: list[int] = []
    for role in HELPER_ROLES:
        cpus_of = p.cpus_for(role)
        assert cpus_of is not None and cpus_of <= share, case
        if role not in roles:
            assert cpus_of == p.other, (case, role)  # found at run time anyway: with `other`
            continue
        place = _place_of(spec, role)
        if place is RolePlace.OWN:
            assert len(cpus_of) == 1 and cpus_of <= p.launch - p.main, (case, role)
            own_cpus.extend(cpus_of)
        elif place is RolePlace.MAIN:
            assert cpus_of == p.main, (case, role)
        else:
            assert cpus_of == loader_cpus, (case, role)
    assert len(own_cpus) == len(set(own_cpus)) == len(own), case  # one CPU per own role
    spare = p.launch - p.main - set(own_cpus)
    # other threads: never on the main thread's CPU while there is any other CPU
    if spare:
        assert p.other == spare, case
    elif rest:
        assert p.other == rest, case
    elif p.launch != p.main:
        assert p.other == p.launch - p.main, case
    else:
        assert p.other == p.main, case
        assert any("other threads run on the main thread's CPU" in w for w in p.warnings), case
    assert p.cpus_for(Role.LAUNCH) == p.main and p.cpus_for(Role.OTHER) == p.other, case
    # loader workers
    if policy is Policy.SPREAD:
        used = [next(iter(w)) for w in p.workers]
        assert all(len(w) == 1 for w in p.workers), case
        assert used == [sorted(rest)[i % len(rest)] for i in range(workers)], case
        oversubscribed = workers > len(rest)
        assert any("oversubscribed" in w for w in p.warnings) == oversubscribed, case
    else:
        assert all(w == loader_cpus for w in p.workers), case
        assert not any("oversubscribed" in w for w in p.warnings), case
    if policy in {Policy.SHARED, Policy.NUMA}:
        assert all(p.main <= w for w in p.workers), case  # workers can reach the main thread
    else:
        assert all(not (w & p.launch) for w in p.workers), case
    # launch roles share a CPU only when asked to (`main`) or when both go with the loader
    rows = [_row_for(p, Role.LAUNCH, 1)] + [_row_for(p, r, 2 + i) for i, r in enumerate(roles)]
    pairs = {
        tuple(line.split(": ")[1].split(" threads share")[0].split(" and "))
        for line in crowded(p, rows)
    }
    beside_main = {("launch", r.value) for r in roles if _place_of(spec, r) is RolePlace.MAIN}
    assert beside_main <= pairs, case
    # a role with a CPU of its own meets only helpers sent to the loader, and only where the
    # loader's CPUs are the whole share (shared, numa)
    wide = policy in {Policy.SHARED, Policy.NUMA}
    loaders = {r.value for r in roles if _place_of(spec, r) is RolePlace.LOADER}
    for pair in pairs:
        for r in own:
            if r.value in pair:
                other_role = pair[1] if pair[0] == r.value else pair[0]
                assert wide and other_role in loaders, (case, pairs)
    if policy not in {Policy.SHARED, Policy.NUMA}:  # there the loader's CPUs include main's
        assert {pair for pair in pairs if pair[0] == "launch"} == beside_main, (case, pairs)


def _row_for(p: Placement, role: Role, tid: int) -> ThreadRow:
    """A thread of ``role`` as apply_threads would leave it: its mask is the planned one."""
    cpus = cpulist(p.cpus_for(role) or ())
    return ThreadRow(
        tid=tid, pid=1, role=role, name=role.value, cpus_planned=cpus, cpus_actual=cpus
    )


@pytest.mark.parametrize("cpus", CPU_SETS.values(), ids=CPU_SETS.keys())
@pytest.mark.parametrize("local_ranks", [1, 4])
def test_policy_none_changes_nothing_whatever_the_split(
    cpus: frozenset[int], local_ranks: int
) -> None:
    p = plan(
        PinningSpec(policy=Policy.NONE, launch_cores=64),
        allowed=cpus,
        workers=3,
        roles=HELPER_ROLES,
        local_ranks=local_ranks,
        local_rank=local_ranks - 1,
    )
    assert (p.launch, p.workers, p.rank_cpus, p.warnings) == (None, None, cpus, ())
    assert all(p.cpus_for(role) is None for role in Role)
    assert p.cpus_for(Role.LOADER, 0) is None
    assert plan_rows(p) == plan_rows(p)[:2]


# ---------------------------------------------------------------------------------------------
# Policies: the table on a 16-CPU rank, role by role


ALL = frozenset(HELPER_ROLES)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        # policy: launch set, main, autograd, pin_memory, comm, other, worker set
        (Policy.SHARED, ("0-3", "0", "1", "2", "3", "4-15", "0-15")),
        (Policy.ISOLATED, ("0-3", "0", "1", "2", "3", "4-15", "4-15")),
        (Policy.ISOLATED_MAIN, ("0", "0", "1-15", "1-15", "1-15", "1-15", "1-15")),
        (Policy.SPREAD, ("0-3", "0", "1", "2", "3", "4-15", None)),
        (Policy.NUMA, ("0-3", "0", "1", "2", "3", "4-15", "0-15")),
    ],
)
def test_the_policy_table(policy: Policy, expected: tuple[str | None, ...]) -> None:
    p = plan(
        PinningSpec(policy=policy),
        allowed=range(16),
        workers=4,
        roles=ALL,
        gpu=0,
        gpu_cpus=frozenset(range(16)),
    )
    launch, main, autograd, pin, comm, other, workers = expected
    roles = p.to_dict()["roles"]
    assert p.to_dict()["launch"] == launch
    assert roles == {
        "launch": main,
        "autograd": autograd,
        "pin_memory": pin,
        "comm": comm,
        "other": other,
    }
    if workers is None:  # spread: one CPU each after the launch set
        assert p.to_dict()["workers"] == ["4", "5", "6", "7"]
    else:
        assert p.to_dict()["workers"] == [workers] * 4
    assert p.warnings == ()


def test_isolated_on_a_two_rank_node_keeps_ranks_apart() -> None:
    cpus = frozenset(range(32))
    placements = [
        plan(
            PinningSpec(policy=Policy.ISOLATED),
            allowed=cpus,
            workers=4,
            roles=ALL,
            local_ranks=2,
            local_rank=r,
        )
        for r in range(2)
    ]
    assert [p.to_dict()["roles"] for p in placements] == [
        {"launch": "0", "autograd": "1", "pin_memory": "2", "comm": "3", "other": "4-15"},
        {"launch": "16", "autograd": "17", "pin_memory": "18", "comm": "19", "other": "20-31"},
    ]
    used = [(p.launch or frozenset()).union(*(p.workers or ())) for p in placements]
    assert used[0].isdisjoint(used[1])
    assert used[0] | used[1] == cpus


def test_explicit_launch_cores_beyond_the_roles_leave_spare_cpus_for_other_threads() -> None:
    p = plan(
        PinningSpec(policy=Policy.ISOLATED, launch_cores=4),
        allowed=range(8),
        workers=2,
        roles={Role.AUTOGRAD},
    )
    assert (p.main, p.autograd, p.other) == ({0}, {1}, {2, 3})
    assert p.workers == (frozenset(range(4, 8)),) * 2


def test_helpers_beside_main_is_the_old_pile_up_on_request() -> None:
    spec = PinningSpec(
        policy=Policy.ISOLATED,
        launch_cores=1,
        autograd=RolePlace.MAIN,
        pin_memory=RolePlace.MAIN,
        comm=RolePlace.MAIN,
    )
    p = plan(spec, allowed=range(4), workers=2, roles=ALL)
    assert p.launch == p.main == p.autograd == p.pin_memory == p.comm == frozenset({0})
    assert p.other == frozenset({1, 2, 3})
    rows = [_row_for(p, role, i) for i, role in enumerate((Role.LAUNCH, *HELPER_ROLES))]
    assert crowded(p, rows) == [
        "isolated: launch and autograd threads share CPU(s) 0: 0 ('launch') with 1 ('autograd')",
        "isolated: launch and pin_memory threads share CPU(s) 0: 0 ('launch') with 2 "
        "('pin_memory')",
        "isolated: launch and comm threads share CPU(s) 0: 0 ('launch') with 3 ('comm')",
        "isolated: autograd and pin_memory threads share CPU(s) 0: 1 ('autograd') with 2 "
        "('pin_memory')",
        "isolated: autograd and comm threads share CPU(s) 0: 1 ('autograd') with 3 ('comm')",
        "isolated: pin_memory and comm threads share CPU(s) 0: 2 ('pin_memory') with 3 ('comm')",
    ]


def test_one_cpu_share_puts_other_threads_on_main_and_says_so() -> None:
    p = plan(PinningSpec(policy=Policy.SHARED), allowed=range(2), workers=1, local_ranks=2)
    assert p.main == p.other == frozenset({0})
    assert p.warnings == (
        "shared: rank 0's launch set {0} is its whole share: the other threads run on the main "
        "thread's CPU",
    )


def test_spread_wraps_around_and_says_so() -> None:
    p = plan(PinningSpec(policy=Policy.SPREAD), allowed=CPU_SETS["ragged"], workers=6)
    assert p.launch == frozenset({1})
    assert p.workers == tuple(frozenset({c}) for c in [5, 6, 7, 12, 5, 6])
    assert len(p.warnings) == 1
    assert "oversubscribed: 6 workers on 4 cores" in p.warnings[0]


# ---------------------------------------------------------------------------------------------
# Policies: impossible requests, with the numbers


def test_explicit_launch_cores_too_few_for_the_roles() -> None:
    with pytest.raises(PlacementError) as err:
        plan(
            PinningSpec(policy=Policy.ISOLATED, launch_cores=2),
            allowed=range(16),
            workers=4,
            roles={Role.AUTOGRAD, Role.PIN_MEMORY},
        )
    assert str(err.value) == (
        "isolated: launch_cores=2 is too few for this run's launch roles: main, autograd, "
        "pin_memory take a CPU each, 3 in all; set launch_cores: auto (or >= 3), or place a "
        "helper beside the main thread or with the loader (pinning.autograd / pin_memory / "
        "comm: main or loader)"
    )


def test_auto_that_does_not_fit_the_share_names_the_numbers() -> None:
    with pytest.raises(PlacementError) as err:
        plan(
            PinningSpec(policy=Policy.ISOLATED),
            allowed=range(6),
            workers=2,
            roles=ALL,
            local_ranks=2,
            local_rank=1,
        )
    assert str(err.value) == (
        "isolated: launch_cores=auto needs 4 CPUs (main, autograd, pin_memory, comm) but rank 1 "
        "of 2 has only 3 CPUs {3,4,5} of the job's 6 allowed"
    )


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


@pytest.mark.parametrize("policy", [Policy.ISOLATED, Policy.SPREAD, Policy.ISOLATED_MAIN])
def test_no_core_left_for_workers_is_an_error_only_with_workers(policy: Policy) -> None:
    spec = PinningSpec(policy=policy, launch_cores=3)
    with pytest.raises(PlacementError, match=r"leaving no CPU for 2 loader worker\(s\)") as err:
        plan(spec, allowed=CPU_SETS["ragged"], workers=2, local_ranks=2, local_rank=0)
    assert "launch_cores=3 but rank 0 of 2 has only 3 CPUs {1,5,6}" in str(err.value)
    p = plan(spec, allowed=CPU_SETS["ragged"], workers=0, local_ranks=2, local_rank=0)
    assert (p.launch, p.workers) == (frozenset({1, 5, 6}), ())


def test_isolated_main_needs_a_cpu_for_the_helpers_it_moves_to_the_loader() -> None:
    spec = PinningSpec(policy=Policy.ISOLATED_MAIN)
    with pytest.raises(PlacementError) as err:
        plan(spec, allowed=range(2), workers=0, roles={Role.AUTOGRAD}, local_ranks=2)
    assert str(err.value) == (
        "isolated-main: launch_cores=auto needs 1 CPU (main) but rank 0 of 2 has only 1 CPU {0} "
        "of the job's 2 allowed, leaving no CPU for the autograd thread"
    )
    p = plan(spec, allowed=range(2), workers=0, roles={Role.AUTOGRAD})
    assert (p.main, p.autograd, p.other) == ({0}, {1}, {1})


def test_shared_lets_workers_share_all_launch_cores() -> None:
    p = plan(PinningSpec(policy=Policy.SHARED, launch_cores=2), allowed=CPU_SETS["2"], workers=2)
    assert p.launch == frozenset({0, 1})
    assert p.workers == (frozenset({0, 1}),) * 2


@pytest.mark.parametrize("policy", list(Policy))
def test_bad_inputs_are_placement_errors(policy: Policy) -> None:
    with pytest.raises(PlacementError, match="workers=-1"):
        plan(PinningSpec(policy=policy), allowed=range(4), workers=-1)
    with pytest.raises(PlacementError, match="launch_cores=0, expected 'auto' or >= 1"):
        plan(PinningSpec(policy=policy, launch_cores=0), allowed=range(4), workers=1)
    with pytest.raises(PlacementError, match="empty"):
        plan(PinningSpec(policy=policy), allowed=(), workers=1)
    with pytest.raises(PlacementError, match=r"roles \['loader'\] are not helper roles"):
        plan(PinningSpec(policy=policy), allowed=range(4), workers=1, roles={Role.LOADER})


@pytest.mark.parametrize(
    ("spec", "roles"),
    [
        (RunSpec(), set()),
        (RunSpec(device=DeviceKind.CUDA, mode=Mode.COMPUTE), {Role.AUTOGRAD}),
        (RunSpec(device=DeviceKind.CUDA, mode=Mode.DATA), set()),
        (
            RunSpec(device=DeviceKind.CUDA, mode=Mode.DATA, loader=LoaderSpec(pin_memory=True)),
            {Role.PIN_MEMORY},
        ),
        (RunSpec(loader=LoaderSpec(pin_memory=True)), set()),  # pinned only on CUDA
        (RunSpec(layout=LayoutSpec(ranks_per_node=2)), {Role.COMM}),
        (
            RunSpec(
                device=DeviceKind.CUDA,
                loader=LoaderSpec(pin_memory=True),
                layout=LayoutSpec(ranks_per_node=2, backend=Backend.NCCL),
            ),
            set(HELPER_ROLES),
        ),
    ],
)
def test_roles_for_a_run(spec: RunSpec, roles: set[Role]) -> None:
    assert roles_for(spec) == roles
    assert launch_need(PinningSpec(policy=Policy.ISOLATED), roles) == 1 + len(roles)
    assert launch_need(PinningSpec(policy=Policy.ISOLATED_MAIN), roles) == 1


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
    assert (p.main, p.other) == ({16}, {17})  # the spare launch CPU
    assert p.workers == (socket1,) * 3
    assert p.rank_cpus == frozenset(range(64))
    assert p.warnings == ()
    auto = plan(
        PinningSpec(policy=Policy.NUMA), allowed=range(64), workers=3, roles=ALL, gpu_cpus=socket1
    )
    assert (auto.main, auto.autograd, auto.pin_memory, auto.comm) == ({16}, {17}, {18}, {19})
    assert auto.other == socket1 - {16, 17, 18, 19}  # the rest of the node before the far one


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
    p = plan(spec, allowed=range(16), workers=2, roles=ALL, gpu=gpu, gpu_cpus=gpu_cpus)
    isolated = plan(PinningSpec(policy=Policy.ISOLATED), allowed=range(16), workers=2, roles=ALL)
    assert p.policy is Policy.NUMA  # what was asked for, the warning says what happened
    assert p.to_dict()["roles"] == isolated.to_dict()["roles"]
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
    p = plan(
        PinningSpec(policy=Policy.SPREAD),
        allowed=CPU_SETS["ragged"],
        workers=5,
        roles={Role.AUTOGRAD},
    )
    assert pickle.loads(pickle.dumps(p)) == p
    assert p.to_dict() == {
        "policy": "spread",
        "allowed": "1,5-7,12",
        "rank_cpus": "1,5-7,12",
        "launch": "1,5",
        "roles": {
            "launch": "1",
            "autograd": "5",
            "pin_memory": "6-7,12",
            "comm": "6-7,12",
            "other": "6-7,12",
        },
        "planned_roles": ["autograd"],
        "workers": ["6", "7", "12", "6", "7"],
        "warnings": list(p.warnings),
    }
    rows = plan_rows(p)
    assert [(r.role, r.worker_id, r.cpus) for r in rows[:6]] == [
        ("allowed", -1, "1,5-7,12"),
        ("rank", -1, "1,5-7,12"),
        ("launch_set", -1, "1,5"),
        ("launch", -1, "1"),
        ("autograd", -1, "5"),
        ("other", -1, "6-7,12"),
    ]
    assert [(r.role, r.worker_id, r.cpus) for r in rows[6:]] == [
        ("loader", 0, "6"),
        ("loader", 1, "7"),
        ("loader", 2, "12"),
        ("loader", 3, "6"),
        ("loader", 4, "7"),
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
def test_apply_threads_pins_every_role_where_planned(helper_threads: _Threads) -> None:
    allowed = _this_machine()
    autograd = helper_threads.start("pt_autograd_0")
    other = helper_threads.start()
    p = plan(PinningSpec(policy=Policy.ISOLATED), allowed=allowed, workers=0, roles={Role.AUTOGRAD})
    main_cpu, autograd_cpu = sorted(allowed)[:2]  # {0} and {1} on most machines
    assert (p.main, p.autograd) == ({main_cpu}, {autograd_cpu})
    assert p.other is not None and main_cpu not in p.other
    rows = apply_threads(p)
    assert os.sched_getaffinity(0) == p.main  # the calling (main) thread
    assert os.sched_getaffinity(autograd) == p.autograd
    assert os.sched_getaffinity(other) == p.other
    assert mismatches(rows) == []
    assert crowded(p, rows) == []
    by_tid = {r.tid: r for r in rows}
    assert by_tid[os.getpid()].cpus_actual == cpulist(p.main)
    assert by_tid[os.getpid()].role is Role.LAUNCH
    assert by_tid[other].cpus_planned == cpulist(p.other)
    # a thread created now inherits the main thread's mask; re-applying (as after step 0)
    # moves it to the other threads' CPUs and changes nothing else
    late = helper_threads.start()
    assert os.sched_getaffinity(late) == p.main
    again = apply_threads(p)
    assert os.sched_getaffinity(late) == p.other
    assert mismatches(again) == []
    assert [r for r in again if r.tid != late] == rows


@pytest.mark.usefixtures("restore_masks")
def test_apply_threads_reports_launch_roles_that_share_a_cpu(helper_threads: _Threads) -> None:
    allowed = _this_machine()
    autograd = helper_threads.start("pt_autograd_0")
    spec = PinningSpec(policy=Policy.ISOLATED, autograd=RolePlace.MAIN)
    p = plan(spec, allowed=allowed, workers=0, roles={Role.AUTOGRAD})
    rows = apply_threads(p)
    main_cpu = min(allowed)
    name = Path("/proc/self/comm").read_text().strip()
    assert crowded(p, rows) == [
        f"isolated: launch and autograd threads share CPU(s) {main_cpu}: {os.getpid()} "
        f"({name!r}) with {autograd} ('pt_autograd_0')"
    ]
    # the same threads with the OS deciding: nothing is pinned, nothing to report
    assert crowded(plan(PinningSpec(), allowed=allowed, workers=0), record_threads(p)) == []


@pytest.mark.usefixtures("restore_masks")
def test_apply_threads_never_widens_and_reports_drift() -> None:
    allowed = _this_machine()
    p = plan(PinningSpec(policy=Policy.SHARED), allowed=allowed, workers=0)
    apply_threads(p)
    os.sched_setaffinity(0, allowed)  # somebody undoes the pinning
    rows = record_threads(p)
    assert mismatches(rows) == [
        f"launch thread {os.getpid()} ({rows[0].name!r}) of pid {os.getpid()}: "
        f"planned {cpulist(p.main or ())}, actual {cpulist(allowed)}"
    ]
    outside = dataclasses.replace(
        p, allowed=frozenset({min(allowed)}), main=frozenset({max(allowed) + 1000})
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


def test_budget_cut_takes_the_first_cpus_of_the_sorted_set_per_local_rank() -> None:
    from codl.pinning import budget_cut

    job = [9, 3, 5, 1, 7, 11]
    assert budget_cut(job, 0, 2) == frozenset(job)
    assert budget_cut(job, 1, 1) == frozenset({1})
    assert budget_cut(job, 2, 2) == frozenset({1, 3, 5, 7})
    assert budget_cut(job, 3, 2) == frozenset(job)
    with pytest.raises(PlacementError) as err:
        budget_cut(job, 4, 2)
    assert str(err.value) == (
        "pinning.cpus: got 4 per rank x 2 local rank(s) = 8 CPUs, but the job has only 6 "
        "allowed CPU(s) {1,3,5,7,9,11}"
    )


# ---------------------------------------------------------------------------------------------
# Slurm tasks bound to their own CPUs

# The environment of task 1 of `srun --ntasks=2 --cpus-per-task=1` on the project's test cluster
# (Slurm 22.05, task/affinity): auto-binding reported as mask_cpu, one mask per local task.
SLURM_BOUND_TASK = {
    "SLURM_JOB_ID": "11",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_LOCALID": "1",
    "SLURM_PROCID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_CPUS_PER_TASK": "1",
    "SLURM_CPU_BIND": "quiet,mask_cpu:0x1,0x2",
    "SLURM_CPU_BIND_LIST": "0x1,0x2",
    "SLURM_CPU_BIND_TYPE": "mask_cpu:",
    "SLURM_CPU_BIND_VERBOSE": "quiet",
}
# The same step with --cpu-bind=none: both tasks see the job's whole set.
SLURM_UNBOUND_TASK = {
    **SLURM_BOUND_TASK,
    "SLURM_CPU_BIND": "quiet,none",
    "SLURM_CPU_BIND_LIST": "",
    "SLURM_CPU_BIND_TYPE": "none",
}
# An sbatch script: SLURM_LOCALID=0, but no step, no binding variables.
SLURM_BATCH_SCRIPT = {"SLURM_JOB_ID": "15", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2"}


def _without(env: dict[str, str], *keys: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in keys}


@pytest.mark.parametrize(
    ("environ", "bound"),
    [
        pytest.param(SLURM_BOUND_TASK, True, id="srun-mask_cpu"),
        pytest.param(SLURM_UNBOUND_TASK, False, id="srun-cpu-bind-none"),
        pytest.param(SLURM_BATCH_SCRIPT, False, id="batch-script"),
        pytest.param({}, False, id="not-under-slurm"),
        pytest.param({"HOME": "/root", "PATH": "/usr/bin"}, False, id="plain-shell"),
        # older Slurm names the step SLURM_STEPID only
        pytest.param(_without(SLURM_BOUND_TASK, "SLURM_STEP_ID"), True, id="stepid-only"),
        pytest.param(_without(SLURM_BOUND_TASK, "SLURM_LOCALID"), False, id="no-localid"),
        # the binding variables of a task, inherited by a process that is no task
        pytest.param(
            _without(SLURM_BOUND_TASK, "SLURM_STEP_ID", "SLURM_STEPID"), False, id="no-step"
        ),
        # without the _TYPE output variable, SLURM_CPU_BIND alone decides
        pytest.param(
            _without(SLURM_BOUND_TASK, "SLURM_CPU_BIND_TYPE"), True, id="cpu-bind-only-mask"
        ),
        pytest.param(
            {**SLURM_BOUND_TASK, "SLURM_CPU_BIND_TYPE": "", "SLURM_CPU_BIND": "verbose,cores"},
            True,
            id="cpu-bind-only-cores",
        ),
        pytest.param(
            _without(SLURM_UNBOUND_TASK, "SLURM_CPU_BIND_TYPE"), False, id="cpu-bind-only-none"
        ),
        # a user's SLURM_CPU_BIND=verbose asks for reports, not for a binding
        pytest.param(
            {**_without(SLURM_BOUND_TASK, "SLURM_CPU_BIND_TYPE"), "SLURM_CPU_BIND": "verbose"},
            False,
            id="cpu-bind-verbose-only",
        ),
        pytest.param(
            {**SLURM_BOUND_TASK, "SLURM_CPU_BIND_TYPE": "map_cpu:", "SLURM_CPU_BIND": ""},
            True,
            id="map_cpu",
        ),
        # a socket or locality domain can be several tasks': split as a job's set
        pytest.param(
            {**SLURM_BOUND_TASK, "SLURM_CPU_BIND_TYPE": "threads,rank_ldom"}, False, id="rank_ldom"
        ),
        pytest.param(
            {**SLURM_BOUND_TASK, "SLURM_CPU_BIND_TYPE": "sockets", "SLURM_CPU_BIND": "sockets"},
            False,
            id="sockets",
        ),
        pytest.param({**SLURM_BOUND_TASK, "SLURM_CPU_BIND_TYPE": "rank"}, True, id="rank"),
        pytest.param(
            {**_without(SLURM_BOUND_TASK, "SLURM_CPU_BIND_TYPE", "SLURM_CPU_BIND")},
            False,
            id="no-bind-variables",
        ),
        # the override, both ways, wherever it is set
        pytest.param({"CODL_TASK_BOUND": "1"}, True, id="override-1-outside-slurm"),
        pytest.param({**SLURM_BOUND_TASK, "CODL_TASK_BOUND": "0"}, False, id="override-0"),
        pytest.param({**SLURM_UNBOUND_TASK, "CODL_TASK_BOUND": " 1 "}, True, id="override-1"),
        pytest.param({**SLURM_BOUND_TASK, "CODL_TASK_BOUND": ""}, True, id="override-empty"),
    ],
)
def test_task_bound_reads_slurm_binding_from_the_environment(
    environ: dict[str, str], bound: bool
) -> None:
    from codl.pinning import task_bound

    assert task_bound(environ) is bound


@pytest.mark.parametrize("value", ["yes", "true", "2", "-1"])
def test_task_bound_override_other_than_0_or_1_is_an_error_naming_the_variable(
    value: str,
) -> None:
    from codl.pinning import task_bound

    with pytest.raises(PlacementError) as err:
        task_bound({**SLURM_BOUND_TASK, "CODL_TASK_BOUND": value})
    assert str(err.value).startswith(f"CODL_TASK_BOUND: got {value!r}, expected 1 ")
    assert " or 0 " in str(err.value)


# Two tasks of one node, each bound by Slurm to its own 4 CPUs of the job's 8 (mask_cpu 0xf,0xf0).
TASK_CPUS = (frozenset(range(4)), frozenset(range(4, 8)))


@pytest.mark.parametrize("local_rank", [0, 1])
def test_a_bound_task_keeps_its_whole_set_and_its_gpu(
    local_rank: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each rank reads only its task's CPUs; splitting them again between the two local ranks
    took half of them (and rank 1 kept the second half of its own set)."""
    own = TASK_CPUS[local_rank]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(own))
    # GPU i's NUMA node holds task i's CPUs: the numa policy must look at the rank's own GPU.
    monkeypatch.setattr("codl.pinning.gpu_local_cpus", lambda gpu, **_: TASK_CPUS[gpu])
    spec = PinningSpec(policy=Policy.NUMA)
    args: dict[str, Any] = {"workers": 2, "local_ranks": 2, "local_rank": local_rank}
    split = plan_for_process(spec, **args, gpu=local_rank, bound=False)
    bound = plan_for_process(spec, **args, gpu=local_rank, bound=True)
    assert split.rank_cpus == rank_share(own, 2, local_rank)  # a shared set: split as before
    assert len(split.rank_cpus) == 2
    assert bound.allowed == bound.rank_cpus == own
    assert bound.main == frozenset({min(own)})
    assert bound.workers == (own,) * 2  # numa: the loader on the GPU's node, all of it
    assert bound.warnings == ()  # the rank's own GPU's node was found inside its set
    # From the environment, as a rank started by srun reads it, and with the binding off.
    monkeypatch.delenv("CODL_TASK_BOUND", raising=False)
    for key, value in {**SLURM_BOUND_TASK, "SLURM_LOCALID": str(local_rank)}.items():
        monkeypatch.setenv(key, value)
    assert plan_for_process(spec, **args, gpu=local_rank) == bound
    monkeypatch.setenv("SLURM_CPU_BIND_TYPE", "none")
    assert plan_for_process(spec, **args, gpu=local_rank) == split


def test_a_bound_tasks_core_budget_is_counted_in_its_own_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pinning.cpus: 4 fits a task bound to 4 CPUs; it asked for 4 x 2 local ranks before."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(TASK_CPUS[1]))
    spec = PinningSpec(policy=Policy.ISOLATED, cpus=4)
    p = plan_for_process(spec, workers=1, local_ranks=2, local_rank=1, bound=True)
    assert p.allowed == p.rank_cpus == TASK_CPUS[1]
    with pytest.raises(PlacementError, match=r"got 4 per rank x 2 local rank\(s\) = 8 CPUs"):
        plan_for_process(spec, workers=1, local_ranks=2, local_rank=1, bound=False)
    small = plan_for_process(
        dataclasses.replace(spec, cpus=3), workers=1, local_ranks=2, local_rank=1, bound=True
    )
    assert small.allowed == small.rank_cpus == frozenset({4, 5, 6})


def test_rank_split_is_the_identity_unless_bound() -> None:
    from codl.pinning import rank_split

    assert rank_split(4, 3, bound=False) == (4, 3)
    assert rank_split(4, 3, bound=True) == (1, 0)
    assert rank_split(1, 0, bound=False) == (1, 0)


def test_a_bound_ranks_messages_name_it_by_its_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its set is split index 0 of 1, but the run log must not call every bound rank "rank 0"."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(TASK_CPUS[1]))
    with pytest.raises(PlacementError) as err:
        plan_for_process(
            PinningSpec(policy=Policy.ISOLATED, launch_cores=4),
            workers=1,
            local_ranks=2,
            local_rank=1,
            bound=True,
        )
    assert str(err.value) == (
        "isolated: launch_cores=4 but rank 1 has only 4 CPUs {4,5,6,7}, its own set, leaving no "
        "CPU for 1 loader worker(s)"
    )
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
    p = plan_for_process(
        PinningSpec(policy=Policy.SHARED), workers=0, local_ranks=2, local_rank=1, bound=True
    )
    assert p.warnings == (
        "shared: rank 1's launch set {5} is its whole share: the other threads run on the main "
        "thread's CPU",
    )
