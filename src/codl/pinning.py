"""CPU-set policies: where loader workers and the threads that launch GPU kernels may run.

See docs/design.md sect. 7. The experiment varies *where* loader worker processes may run
relative to the threads that feed the GPU, so each policy is a placement of two roles inside the
CPUs the job was given: the *launch roles* (the main thread, which launches kernels, plus the
autograd, pin-memory and communication threads that sit on the same critical path) and the
*loader workers*.

Everything happens inside the CPU set the job was given, captured once with
``os.sched_getaffinity(0)`` at start (``allowed``); a mask is never widened beyond it, because on
a shared node the CPUs outside it belong to somebody else's job. The allowed set is split between
the local ranks of a node: rank ``r`` of ``R`` gets the ``r``-th contiguous chunk of the *sorted*
allowed set, the first ``len(allowed) % R`` ranks one CPU more (its *share* ``S``). Contiguous
chunks of the sorted ids keep a rank on one socket on machines that number CPUs socket by socket.
The split is right when every rank of a node sees the node's whole set: ranks spawned locally
from one process, or Slurm tasks that Slurm did not bind. When Slurm's task/affinity plugin bound
each task to its own CPUs (``srun --cpus-per-task`` auto-binds to ``mask_cpu``, or an explicit
``--cpu-bind``), the set a rank reads is already its own: :func:`task_bound` says so from the
environment, and :func:`rank_split` then makes the rank the only one sharing its set
(``local_ranks=1, local_rank=0``), so it keeps all of its CPUs and a core budget is counted in
them alone; the rank keeps its GPU. ``CODL_TASK_BOUND=1``/``0`` overrides the detection.

Roles are placed one by one (docs/design.md sect. 7): the *main* thread (role ``launch``) launches
nearly every kernel, the *autograd* thread runs the whole backward, the *pin-memory* thread copies
every batch, the *comm* threads drive NCCL/gloo; piled onto one CPU they make the main thread wait
behind its own helpers. Each helper role present in the run (:func:`roles_for`) is placed by its
key ``PinningSpec.autograd`` / ``pin_memory`` / ``comm``: ``own`` (default; a CPU of its own),
``main`` (on the main thread's CPU: the pile-up, only on request) or ``loader`` (on the loader
workers' CPUs). The *launch set* ``L`` is the first CPUs of the share: the main thread's CPU,
then one CPU per ``own`` helper in the order autograd, pin_memory, comm, then spare CPUs when
``launch_cores`` asks for more than that; ``launch_cores: auto`` asks for exactly that. ``R`` is
``S`` minus ``L``.

=============  ========  ===========  ==============  ===========  ============================
policy         main      own helper   ``loader``      other        loader worker ``i`` (of W)
                                      helper                       threads
=============  ========  ===========  ==============  ===========  ============================
none           unchanged (the OS decides); the plan has no CPU sets, masks are still recorded
shared         1st of L  next of L    ``S``           spare or R   ``S``: workers can and do run
                                                                   on the launch CPUs (worst
                                                                   case)
isolated       1st of L  next of L    ``R``           spare or R   ``R`` (error if empty, W > 0)
isolated-main  1st of L  -- every helper goes with    spare or R   ``R`` (error if empty and
                         the loader: ``R``                         W > 0 or helpers present)
spread         1st of L  next of L    ``R``           spare or R   one CPU, ``R[i mod len(R)]``;
                                                                   W > len(R) wraps around and
                                                                   records "oversubscribed"
numa           as shared, with ``L`` taken from ``N`` = ``S`` intersected with the CPUs local to
               the rank's GPU, ``loader`` = ``N``, other = spare or ``N - L`` or ``R``; unknown
               topology or empty ``N``: ``isolated`` on ``S``, with a warning in the placement
=============  ========  ===========  ==============  ===========  ============================

``other`` threads (the intra-op pool, CUDA driver and Python helpers, unnamed NCCL threads) are
confined to the share and never put on the main thread's CPU while there is another: the spare
launch CPUs if any, else ``R``, else (``R`` empty) the helpers' CPUs, else, on a one-CPU share, the
main thread's CPU with a warning. A helper role the plan was not made for that shows up anyway
gets the ``other`` CPUs. ``isolated-main`` against ``isolated`` separates "the launch thread
alone" from "all launch roles together"; ``main`` placements reproduce the old all-on-one-core
layout on purpose.

Impossible requests raise :class:`PlacementError` from :func:`plan`, i.e. before the run
starts, with the numbers in the message: an explicit ``launch_cores`` smaller than the roles it
must hold, a launch set larger than the share, a share of only launch CPUs while there are
workers or ``loader`` helpers to place, more local ranks than allowed CPUs. After pinning, the
harness reads every thread's mask back (:func:`apply_threads` returns them) and records, as a
warning in the trace and the run log, every pair of launch roles whose threads share a CPU
(:func:`crowded`).

Policies are pure: :func:`plan` maps (spec, allowed CPUs, local ranks, local rank, workers,
helper roles, GPU topology) to a :class:`Placement` and never touches the machine. The impure
parts are separate: :func:`gpu_local_cpus` reads the topology from sysfs, :func:`apply_threads`
pins the threads of the rank process by TID and :func:`apply_worker` pins a loader worker from
``worker_init_fn``.

Threads and their roles. :func:`discover_threads` reads ``/proc/<pid>/task/*/comm`` (the kernel
truncates names to 15 bytes). Names come from the PyTorch and NCCL sources and the strings of the
installed torch 2.14 / NCCL libraries, and were seen on an H200 node (torch 2.11, one NCCL rank
plus a gloo group, a CUDA backward, a DataLoader with ``pin_memory=True``):

- main thread (``tid == pid``): *launch*. Its name is the process name (``python3``).
- ``pt_autograd_<device>``: *autograd*, one per accelerator device, named in
  ``torch/csrc/autograd/engine.cpp`` ``Engine::thread_init`` and started at the first backward
  that touches the device. A CPU-only backward runs on the calling thread: no such thread.
- *comm*: the c10d threads ``pt_nccl_watchdg`` (watchdog), ``pt_nccl_heartbt`` (heartbeat
  monitor), ``pt_nccl_runhook``, ``pt_nccl_gil_chk``, ``pt_gloo_runloop`` (one per gloo work
  thread, 2 by default) and ``pt_tcpstore``/``pt_tcpstore_uv`` (the store daemon, rank 0 only).
  NCCL's own threads (``NCCL Progress%2d`` proxy, ``NCCL Service %2d``, ``NCCL UDS Servic``,
  ``NCCL RAS``, ``NCCL Sock...``, ``NCCL IbAsync %2d``) are named **only if
  ``NCCL_SET_THREAD_NAME=1``** (default 0; the harness sets it before the process group starts
  unless the environment already says otherwise); otherwise they keep the name of the thread
  that created them (``python3``) and land in *other*. Gloo's transport
  threads are never named. Names containing ``gloo`` or ``ProcessGroup`` are taken as comm too.
- *pin_memory*: DataLoader's pin-memory thread names itself ``pt_data_pin`` in recent torch
  (``torch/utils/data/_utils/pin_memory.py``); older versions leave the creator's name, so the
  thread is also found as the Python thread whose name contains ``_pin_memory_loop`` (the default
  ``Thread-N (_pin_memory_loop)``) through ``threading.enumerate()`` and ``Thread.native_id``,
  which works only from inside the process that owns it.
- *loader*: every thread of a loader worker process. Workers name their main thread
  ``pt_data_worker`` (``torch/utils/data/_utils/worker.py``, before ``worker_init_fn`` runs), which
  is how a worker is recognised from its PID alone.
- everything else: *other* (``pt_thread_pool``, OpenMP workers, CUDA driver threads such as
  ``cuda-EvtHandlr`` and ``cuda00001800007``, unnamed NCCL/gloo threads, Python threads).

Linux gives a new thread its creator's mask, so threads created after :func:`apply_threads` by a
pinned thread start out pinned like it; the harness calls :func:`apply_threads` again after the
first step (it is idempotent) to catch threads created lazily with another mask.
"""

from __future__ import annotations

import enum
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codl.errors import PlacementError
from codl.spec import AUTO, DeviceKind, Handoff, PinningSpec, Policy, RolePlace, RunSpec

# Messages list small CPU sets one by one ("{0,1,2}") and large ones as kernel ranges.
_LIST_CPUS_UP_TO = 16


class Role(enum.StrEnum):
    """What a thread does, as far as placement is concerned."""

    LAUNCH = "launch"
    AUTOGRAD = "autograd"
    PIN_MEMORY = "pin_memory"
    COMM = "comm"
    LOADER = "loader"
    OTHER = "other"


#: Roles placed on ``Placement.launch``: every thread on the path from Python to the GPU.
LAUNCH_ROLES: frozenset[Role] = frozenset({Role.LAUNCH, Role.AUTOGRAD, Role.PIN_MEMORY, Role.COMM})


# ---------------------------------------------------------------------------------------------
# cpulist format


def cpulist(cpus: Iterable[int]) -> str:
    """Format CPU ids the way the kernel writes cpulists: ``{0,1,2,3,8,10,11}`` -> ``0-3,8,10-11``.

    The empty set is ``""`` (as in an empty sysfs cpulist).
    """
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+)/(\d+))?)?$")


def parse_cpulist(text: str) -> frozenset[int]:
    """Parse a kernel cpulist (``0-3,8,10-11``; also the stride form ``0-15:2/4``).

    Whitespace around the list (sysfs files end in a newline) is ignored; ``""`` is the empty set.
    The stride form ``a-b:u/g`` takes the first ``u`` CPUs of every group of ``g`` from ``a`` to
    ``b``, as ``bitmap_parselist`` does for ``isolcpus=`` and cgroup files.
    """
    out: set[int] = set()
    stripped = text.strip()
    if not stripped:
        return frozenset()
    for part in stripped.split(","):
        m = _RANGE.match(part.strip())
        if m is None:
            raise ValueError(f"cpulist {text!r}: bad element {part!r}, expected N, N-M or N-M:U/G")
        lo = int(m[1])
        hi = int(m[2]) if m[2] is not None else lo
        if hi < lo:
            raise ValueError(f"cpulist {text!r}: range {part!r} runs backwards")
        used, group = (int(m[3]), int(m[4])) if m[3] is not None else (1, 1)
        if group == 0 or used == 0 or used > group:
            raise ValueError(f"cpulist {text!r}: stride {part!r} needs 0 < used <= group")
        out.update(c for c in range(lo, hi + 1) if (c - lo) % group < used)
    return frozenset(out)


def _cpus(cpus: frozenset[int]) -> str:
    return f"{len(cpus)} CPU" if len(cpus) == 1 else f"{len(cpus)} CPUs"


def _braced(cpus: Iterable[int]) -> str:
    ids = sorted(set(cpus))
    body = ",".join(map(str, ids)) if len(ids) <= _LIST_CPUS_UP_TO else cpulist(ids)
    return "{" + body + "}"


# ---------------------------------------------------------------------------------------------
# The placement and the pure policies

#: The launch roles besides the main thread, in the order they get CPUs of their own.
HELPER_ROLES: tuple[Role, ...] = (Role.AUTOGRAD, Role.PIN_MEMORY, Role.COMM)


def roles_for(spec: RunSpec) -> frozenset[Role]:
    """The helper roles whose threads a rank process of ``spec`` will have.

    ``autograd``: a backward on CUDA (a CPU backward runs on the calling thread); ``pin_memory``:
    torch's loader with ``pin_memory`` on CUDA (the harness pins only on CUDA; the ring hand-off
    page-locks its slots once and has no such thread); ``comm``: a process
    group, which every run of more than one rank starts.
    """
    cuda = spec.device is DeviceKind.CUDA
    roles: set[Role] = set()
    if cuda and spec.mode.computes:
        roles.add(Role.AUTOGRAD)
    if cuda and spec.mode.loads and spec.loader.pin_memory and spec.loader.handoff is Handoff.TORCH:
        roles.add(Role.PIN_MEMORY)
    if spec.layout.world_size > 1:
        roles.add(Role.COMM)
    return frozenset(roles)


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where one rank's threads and loader workers may run; the output of :func:`plan`.

    Picklable (it travels to loader workers inside the ``worker_init_fn`` partial). Every CPU set
    is ``None`` only under policy ``none``, which changes nothing. ``launch`` is the launch set
    (``main``, the helpers placed ``own``, spare CPUs); ``roles`` are the helper roles the plan
    was made for. A helper role that was not planned for has the ``other`` CPUs.
    """

    policy: Policy
    allowed: frozenset[int]
    rank_cpus: frozenset[int]
    launch: frozenset[int] | None
    main: frozenset[int] | None
    autograd: frozenset[int] | None
    pin_memory: frozenset[int] | None
    comm: frozenset[int] | None
    other: frozenset[int] | None
    workers: tuple[frozenset[int], ...] | None
    roles: frozenset[Role] = frozenset()
    warnings: tuple[str, ...] = ()

    def cpus_for(self, role: Role, worker_id: int | None = None) -> frozenset[int] | None:
        """The CPUs a thread of ``role`` is meant to run on; ``None`` when nothing is planned.

        Nothing is planned under policy ``none``, nor for a loader thread without ``worker_id``.
        """
        if self.workers is None:
            return None
        if role is Role.LOADER:
            if worker_id is None:
                return None  # a worker seen from outside, whose id nobody gave
            if not 0 <= worker_id < len(self.workers):
                raise PlacementError(
                    f"{self.policy.value}: no placement for loader worker {worker_id}; "
                    f"the plan was made for {len(self.workers)} worker(s)"
                )
            return self.workers[worker_id]
        return {
            Role.LAUNCH: self.main,
            Role.AUTOGRAD: self.autograd,
            Role.PIN_MEMORY: self.pin_memory,
            Role.COMM: self.comm,
            Role.OTHER: self.other,
        }[role]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, CPU sets as cpulists, for the trace's provenance attributes."""
        per_role = None
        if self.workers is not None:
            per_role = {
                role.value: cpulist(self.cpus_for(role) or ())
                for role in (Role.LAUNCH, *HELPER_ROLES, Role.OTHER)
            }
        return {
            "policy": self.policy.value,
            "allowed": cpulist(self.allowed),
            "rank_cpus": cpulist(self.rank_cpus),
            "launch": None if self.launch is None else cpulist(self.launch),
            "roles": per_role,
            "planned_roles": sorted(r.value for r in self.roles),
            "workers": None if self.workers is None else [cpulist(w) for w in self.workers],
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True, kw_only=True)
class PlanRow:
    """One line of the placement asked for: ``role`` (``worker_id`` for loader rows) and CPUs."""

    role: str
    worker_id: int
    cpus: str


def plan_rows(placement: Placement) -> list[PlanRow]:
    """The placement asked for, one row per role (and per worker), for the trace.

    Rows ``allowed`` and ``rank`` give the job's set and the rank's share, ``launch_set`` the
    launch set; then ``launch`` (the main thread), the helper roles planned for, ``other`` and one
    ``loader`` row per worker. ``worker_id`` is -1 except on loader rows. Policy ``none`` yields
    only the first two rows.
    """
    rows = [
        PlanRow(role="allowed", worker_id=-1, cpus=cpulist(placement.allowed)),
        PlanRow(role="rank", worker_id=-1, cpus=cpulist(placement.rank_cpus)),
    ]
    if placement.launch is None:
        return rows
    rows.append(PlanRow(role="launch_set", worker_id=-1, cpus=cpulist(placement.launch)))
    for role in (Role.LAUNCH, *HELPER_ROLES, Role.OTHER):
        if role in HELPER_ROLES and role not in placement.roles:
            continue
        rows.append(PlanRow(role=role, worker_id=-1, cpus=cpulist(placement.cpus_for(role) or ())))
    for i, cpus in enumerate(placement.workers or ()):
        rows.append(PlanRow(role=Role.LOADER, worker_id=i, cpus=cpulist(cpus)))
    return rows


def rank_share(allowed: Iterable[int], local_ranks: int, local_rank: int) -> frozenset[int]:
    """The contiguous chunk of the sorted ``allowed`` CPUs that belongs to ``local_rank``.

    Chunks are as even as possible; the first ``len(allowed) % local_ranks`` ranks get one more.
    """
    ids = sorted(set(allowed))
    if local_ranks < 1:
        raise PlacementError(f"rank split: local_ranks={local_ranks}, expected >= 1")
    if not 0 <= local_rank < local_ranks:
        raise PlacementError(
            f"rank split: local_rank={local_rank}, expected 0..{local_ranks - 1} "
            f"(local_ranks={local_ranks})"
        )
    if local_ranks > len(ids):
        raise PlacementError(
            f"rank split: {local_ranks} local ranks but the job has only {len(ids)} allowed "
            f"CPU(s) {_braced(ids)}; every rank needs at least one"
        )
    base, extra = divmod(len(ids), local_ranks)
    start = local_rank * base + min(local_rank, extra)
    size = base + (1 if local_rank < extra else 0)
    return frozenset(ids[start : start + size])


def budget_cut(allowed: Iterable[int], cpus: int, local_ranks: int) -> frozenset[int]:
    """The CPUs a run with core budget ``cpus`` (``PinningSpec.cpus``) may use: the first
    ``cpus x local_ranks`` of the sorted ``allowed`` set, or all of it when ``cpus`` is 0.

    Taken before :func:`plan`, so every policy (``none`` too) places inside the budget and the
    ranks' shares split it as they would a job of that size.
    """
    ids = sorted(set(allowed))
    if cpus < 0:
        raise PlacementError(f"pinning.cpus: got {cpus}, expected an integer >= 0")
    if cpus == 0:
        return frozenset(ids)
    need = cpus * max(1, local_ranks)
    if need > len(ids):
        raise PlacementError(
            f"pinning.cpus: got {cpus} per rank x {local_ranks} local rank(s) = {need} CPUs, but "
            f"the job has only {len(ids)} allowed CPU(s) {_braced(ids)}"
        )
    return frozenset(ids[:need])


#: Environment variable that overrides :func:`task_bound`: ``1`` (this process's CPU set is its
#: rank's own), ``0`` (it is shared by the node's local ranks).
TASK_BOUND_ENV = "CODL_TASK_BOUND"

# Words of Slurm's --cpu-bind that set only how loudly it binds, not how.
_BIND_VERBOSITY = frozenset({"q", "quiet", "v", "verbose"})
_BIND_NONE = frozenset({"no", "none"})
# Bindings that give a task CPUs of its own, and bindings to a socket or locality domain, which
# several tasks of a node can share (more tasks than sockets): such a set is split as a job's.
_BIND_OWN = frozenset({"mask_cpu", "map_cpu", "rank", "cores", "threads"})
_BIND_DOMAIN = frozenset({"sockets", "ldoms", "rank_ldom", "map_ldom", "mask_ldom", "boards"})


def task_bound(environ: Mapping[str, str]) -> bool:
    """Whether the CPU set of a process with environment ``environ`` is already its rank's own.

    True for a Slurm task (``SLURM_STEP_ID`` or ``SLURM_STEPID``, and ``SLURM_LOCALID``, which
    srun sets in every task; a batch script has ``SLURM_LOCALID`` but no step id) that Slurm
    bound to CPUs of its own: ``SLURM_CPU_BIND_TYPE``, srun's output variable, names
    ``mask_cpu:``, ``map_cpu:``, ``rank``, ``cores`` or ``threads`` and no binding to a socket
    or locality domain (``sockets``, ``ldoms``, ``rank_ldom``, ``map_ldom:``, ``mask_ldom:``),
    which several tasks can share and which is therefore split as a job's set (one task per
    domain: ``CODL_TASK_BOUND=1``); where it is absent or empty, ``SLURM_CPU_BIND``
    (``quiet,mask_cpu:0x1,0x2``) is read the same way, its verbosity words and list elements
    skipped. On Slurm 22.05 the auto-binding of
    ``--cpus-per-task`` and ``--cpu-bind=cores`` both show up as ``mask_cpu:``,
    ``--cpu-bind=none`` as ``none``. ``SLURM_CPU_BIND_LIST`` is not read: its entries are
    Slurm's abstract CPU ids, which need not be the kernel's.

    ``CODL_TASK_BOUND`` (:data:`TASK_BOUND_ENV`) overrides the detection: ``1`` or ``0``; any
    other non-empty value raises :class:`PlacementError`. Pure: reads only ``environ``.
    """
    override = environ.get(TASK_BOUND_ENV, "").strip()
    if override:
        if override not in ("0", "1"):
            raise PlacementError(
                f"{TASK_BOUND_ENV}: got {override!r}, expected 1 (each rank's CPU set is its "
                "own: do not split it between local ranks) or 0 (the local ranks share it)"
            )
        return override == "1"
    in_task = "SLURM_LOCALID" in environ and (
        "SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ
    )
    if not in_task:
        return False
    words = _bind_words(environ.get("SLURM_CPU_BIND_TYPE", ""))
    if not words:
        words = _bind_words(environ.get("SLURM_CPU_BIND", ""))
    if words & (_BIND_NONE | _BIND_DOMAIN):
        return False
    return bool(words & _BIND_OWN)


def _bind_words(text: str) -> frozenset[str]:
    """The binding words of a --cpu-bind value: ``quiet,mask_cpu:0x1,0x2`` -> ``{mask_cpu}``."""
    words: set[str] = set()
    for part in text.split(","):
        word = part.split(":", 1)[0].strip().lower()
        # Skipped: verbosity, and the elements of a map/mask list after its first
        # ("0x2", "3", "0xf0*4"), which a comma-split separates from their type.
        if word and word not in _BIND_VERBOSITY and not word[0].isdigit():
            words.add(word)
    return frozenset(words)


def rank_split(local_ranks: int, local_rank: int, *, bound: bool) -> tuple[int, int]:
    """(ranks that share the CPU set this rank reads, this rank's index among them).

    ``(local_ranks, local_rank)`` when every local rank sees the node's whole set; ``(1, 0)``
    when the set is already the rank's own (``bound``, :func:`task_bound`), which splitting it
    again would take from the rank. The first is what :func:`budget_cut` multiplies the budget
    by and what :func:`plan` splits by; the trace records it as ``cpus_split``.
    """
    return (1, 0) if bound else (local_ranks, local_rank)


def role_places(spec: PinningSpec) -> dict[Role, RolePlace]:
    """Where each helper role goes under ``spec``: its setting, or the loader's under
    ``isolated-main``, which isolates the main thread alone."""
    if spec.policy is Policy.ISOLATED_MAIN:
        return dict.fromkeys(HELPER_ROLES, RolePlace.LOADER)
    return {
        Role.AUTOGRAD: spec.autograd,
        Role.PIN_MEMORY: spec.pin_memory,
        Role.COMM: spec.comm,
    }


def launch_need(spec: PinningSpec, roles: Iterable[Role]) -> int:
    """CPUs the launch set must hold: the main thread's plus one per helper role placed ``own``.

    What ``launch_cores: auto`` asks for; with :func:`roles_for`, what a job must be given per
    rank beyond its loader CPUs.
    """
    places = role_places(spec)
    return 1 + sum(1 for r in set(roles) if places[r] is RolePlace.OWN)


def plan(
    spec: PinningSpec,
    *,
    allowed: Iterable[int],
    workers: int,
    roles: Iterable[Role] = (),
    local_ranks: int = 1,
    local_rank: int = 0,
    gpu: int | None = None,
    gpu_cpus: frozenset[int] | None = None,
    rank: int | None = None,
) -> Placement:
    """The placement of one rank under ``spec``; pure: nothing is read from or done to the machine.

    ``allowed`` is the job's CPU set (``os.sched_getaffinity(0)`` at start), ``workers`` the
    number of loader workers of this rank, ``roles`` the helper roles (of :data:`HELPER_ROLES`)
    whose threads the rank will have (:func:`roles_for`), ``gpu`` the rank's GPU index (``None``
    on CPU runs) and ``gpu_cpus`` the CPUs local to that GPU (:func:`gpu_local_cpus`; ``None`` if
    unknown), read only by policy ``numa``. ``local_ranks`` ranks share ``allowed``, this one
    takes share ``local_rank``; ``rank``, the local rank, when ``allowed`` is the rank's own set
    (:func:`rank_split`). Raises :class:`PlacementError` for impossible requests, with numbers.
    """
    allowed_set = frozenset(allowed)
    helpers = frozenset(roles)
    _check_request(spec, allowed_set, helpers, workers)
    if spec.policy is Policy.NONE:
        # Nothing is split or pinned, so a rank may run anywhere the job may: that is what the
        # recorded masks will show, and an impossible split is no reason to refuse a no-op.
        return _unpinned(spec.policy, allowed_set, helpers)
    share = rank_share(allowed_set, local_ranks, local_rank)
    label = local_rank if rank is None else rank
    where = _share_text(share, len(allowed_set), local_ranks, local_rank, rank)
    places = role_places(spec)
    own = [r for r in HELPER_ROLES if r in helpers and places[r] is RolePlace.OWN]
    need = launch_need(spec, helpers)
    k, asked = _launch_size(spec, own, need)
    warnings: list[str] = []
    pool, loader_wide, head, where = _launch_pool(
        spec.policy, share, label, where, gpu, gpu_cpus, warnings
    )
    if k > len(pool):
        raise PlacementError(f"{head}: {asked} but {where}")
    ordered = sorted(pool)
    launch = frozenset(ordered[:k])
    main = frozenset(ordered[:1])
    own_cpus = {r: frozenset({ordered[1 + i]}) for i, r in enumerate(own)}
    rest = sorted(share - launch)
    loader_cpus = pool if loader_wide else frozenset(rest)
    with_loader = [r.value for r in HELPER_ROLES if r in helpers and places[r] is RolePlace.LOADER]
    if not loader_cpus and (workers > 0 or with_loader):
        raise PlacementError(f"{head}: {asked} but {where}, {_homeless(workers, with_loader)}")
    worker_cpus = _worker_cpus(spec.policy, workers, rest, loader_cpus, warnings)
    # The other threads (intra-op pool, CUDA and Python helpers) go where they cannot delay the
    # main thread: spare launch CPUs, else what the launch set leaves (of the GPU's NUMA node
    # first), else the helpers' CPUs.
    other = frozenset(ordered[need:k]) or (pool - launch) or frozenset(rest) or (launch - main)
    if not other:
        other = main
        warnings.append(_pile_up(spec.policy, label, main))
    cpus_of = _helper_cpus(helpers, places, own_cpus, main=main, loader=loader_cpus, other=other)
    return Placement(
        policy=spec.policy,
        allowed=allowed_set,
        rank_cpus=share,
        launch=launch,
        main=main,
        autograd=cpus_of[Role.AUTOGRAD],
        pin_memory=cpus_of[Role.PIN_MEMORY],
        comm=cpus_of[Role.COMM],
        other=other,
        workers=worker_cpus,
        roles=helpers,
        warnings=tuple(warnings),
    )


def _helper_cpus(
    helpers: frozenset[Role],
    places: dict[Role, RolePlace],
    own_cpus: dict[Role, frozenset[int]],
    *,
    main: frozenset[int],
    loader: frozenset[int],
    other: frozenset[int],
) -> dict[Role, frozenset[int]]:
    """Each helper role's CPUs: its own, the main thread's or the loader's, as placed; a role
    the rank has no thread of goes with the other threads."""
    out = {}
    for role in HELPER_ROLES:
        if role not in helpers:
            out[role] = other
        elif places[role] is RolePlace.OWN:
            out[role] = own_cpus[role]
        else:
            out[role] = main if places[role] is RolePlace.MAIN else loader
    return out


def _share_text(
    share: frozenset[int], allowed: int, local_ranks: int, local_rank: int, rank: int | None
) -> str:
    """What a rank has, for messages: its share of the job's set, or (``rank`` given) its own.

    A rank whose set is its own is split index 0 of 1; its message names it by ``rank``, its
    local rank, or every such rank would be "rank 0"."""
    if rank is None:
        return (
            f"rank {local_rank} of {local_ranks} has only {_cpus(share)} {_braced(share)} "
            f"of the job's {allowed} allowed"
        )
    return f"rank {rank} has only {_cpus(share)} {_braced(share)}, its own set"


def _pile_up(policy: Policy, label: int, main: frozenset[int]) -> str:
    return (
        f"{policy.value}: rank {label}'s launch set {_braced(main)} is its whole "
        "share: the other threads run on the main thread's CPU"
    )


def _unpinned(policy: Policy, allowed: frozenset[int], helpers: frozenset[Role]) -> Placement:
    return Placement(
        policy=policy,
        allowed=allowed,
        rank_cpus=allowed,
        launch=None,
        main=None,
        autograd=None,
        pin_memory=None,
        comm=None,
        other=None,
        workers=None,
        roles=helpers,
    )


def _launch_pool(
    policy: Policy,
    share: frozenset[int],
    local_rank: int,
    where: str,
    gpu: int | None,
    gpu_cpus: frozenset[int] | None,
    warnings: list[str],
) -> tuple[frozenset[int], bool, str, str]:
    """The CPUs the launch set is taken from; whether the workers may share them; and the
    head and "where" of the error raised when they are too few (``where``: the share's, unless
    ``numa`` narrows it). ``numa`` narrows the pool to the GPU's node, or falls back to
    ``isolated`` with a warning appended to ``warnings``."""
    if policy is not Policy.NUMA:
        return share, policy is Policy.SHARED, policy.value, where
    local = share & gpu_cpus if gpu_cpus is not None else frozenset()
    if local:
        where = (
            f"only {_cpus(local)} {_braced(local)} of rank {local_rank}'s share "
            f"{_braced(share)} are local to GPU {gpu}"
        )
        return local, True, policy.value, where
    warning = f"{_numa_unknown(share, local_rank, gpu, gpu_cpus)}; fell back to isolated"
    warnings.append(warning)
    return share, False, f"{warning}, and isolated is impossible", where


def _homeless(workers: int, with_loader: list[str]) -> str:
    homeless = ([f"{workers} loader worker(s)"] if workers else []) + [
        f"the {r} thread" for r in with_loader
    ]
    return f"leaving no CPU for {' and '.join(homeless)}"


def _check_request(
    spec: PinningSpec, allowed: frozenset[int], helpers: frozenset[Role], workers: int
) -> None:
    """Refuse what no policy can place, before any policy is looked at."""
    name = spec.policy.value
    if not allowed:
        raise PlacementError(f"{name}: the job's allowed CPU set is empty")
    if workers < 0:
        raise PlacementError(f"{name}: workers={workers}, expected >= 0")
    if isinstance(spec.launch_cores, int) and spec.launch_cores < 1:
        raise PlacementError(f"{name}: launch_cores={spec.launch_cores}, expected 'auto' or >= 1")
    if not helpers <= frozenset(HELPER_ROLES):
        raise PlacementError(
            f"{name}: roles {sorted(r.value for r in helpers - frozenset(HELPER_ROLES))} are "
            f"not helper roles; expected some of {[r.value for r in HELPER_ROLES]}"
        )


def _launch_size(spec: PinningSpec, own: list[Role], need: int) -> tuple[int, str]:
    """CPUs of the launch set, and how the request reads in an error message."""
    holds = ", ".join(["main", *(r.value for r in own)])
    if spec.launch_cores == AUTO:
        return need, f"launch_cores=auto needs {_cpus_n(need)} ({holds})"
    k = int(spec.launch_cores)
    if k < need:
        raise PlacementError(
            f"{spec.policy.value}: launch_cores={k} is too few for this run's launch roles: "
            f"{holds} take a CPU each, {need} in all; set launch_cores: auto (or >= {need}), or "
            "place a helper beside the main thread or with the loader "
            "(pinning.autograd / pin_memory / comm: main or loader)"
        )
    return k, f"launch_cores={k}"


def _worker_cpus(
    policy: Policy,
    workers: int,
    rest: list[int],
    loader_cpus: frozenset[int],
    warnings: list[str],
) -> tuple[frozenset[int], ...]:
    """Each loader worker's CPUs: one core each, round-robin, under ``spread``; else the
    loader's set. An oversubscribed ``spread`` is appended to ``warnings``."""
    if policy is not Policy.SPREAD:
        return (loader_cpus,) * workers
    if workers > len(rest):
        warnings.append(
            f"spread: oversubscribed: {workers} workers on {len(rest)} cores "
            f"{_braced(rest)}; worker i runs on core i mod {len(rest)}"
        )
    return tuple(frozenset({rest[i % len(rest)]}) for i in range(workers))


def _cpus_n(n: int) -> str:
    return "1 CPU" if n == 1 else f"{n} CPUs"


def _numa_unknown(
    share: frozenset[int], local_rank: int, gpu: int | None, gpu_cpus: frozenset[int] | None
) -> str:
    if gpu is None:
        return f"numa: topology unknown for rank {local_rank} (no GPU: CPU run)"
    if gpu_cpus is None:
        return f"numa: topology unknown for GPU {gpu}"
    return (
        f"numa: GPU {gpu}'s local CPUs {_braced(gpu_cpus)} miss rank {local_rank}'s "
        f"share {_braced(share)}"
    )


# ---------------------------------------------------------------------------------------------
# Topology (impure)

_BUS_ID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def normalize_pci_bus_id(bus_id: str) -> str:
    """``00000000:3B:00.0`` (NVML, CUDA) -> ``0000:3b:00.0`` (the sysfs directory name)."""
    m = _BUS_ID.match(bus_id.strip())
    if m is None:
        raise ValueError(f"PCI bus id {bus_id!r}: expected DOMAIN:BUS:DEVICE.FUNCTION in hex")
    return f"{int(m[1], 16):04x}:{m[2].lower()}:{m[3].lower()}.{m[4]}"


def pci_local_cpus(bus_id: str, *, sysfs: Path = Path("/sys")) -> frozenset[int] | None:
    """The CPUs local to PCI device ``bus_id`` according to sysfs; ``None`` if unknown.

    A ``numa_node`` of -1 means the firmware did not say: on a single-node machine every CPU is
    then local (and ``local_cpulist`` lists them all), but on a multi-node machine the full
    ``local_cpulist`` the kernel falls back to would be a lie, so that case is unknown.
    """
    device = sysfs / "bus" / "pci" / "devices" / normalize_pci_bus_id(bus_id)
    try:
        local = parse_cpulist((device / "local_cpulist").read_text())
    except FileNotFoundError:
        return None
    try:
        node = int((device / "numa_node").read_text().strip())
    except (FileNotFoundError, ValueError):
        node = -1
    if node < 0:
        try:
            nodes = parse_cpulist((sysfs / "devices" / "system" / "node" / "online").read_text())
        except FileNotFoundError:
            return None
        if len(nodes) != 1:
            return None
    return local or None


def gpu_pci_bus_id(gpu_index: int) -> str | None:
    """The sysfs-style PCI bus id of CUDA device ``gpu_index`` (as torch numbers it), or ``None``.

    torch's device properties carry the PCI domain/bus/device numbers; NVML, the fallback, is
    looked up by UUID because NVML numbers *all* GPUs while torch numbers the visible ones.
    """
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or not 0 <= gpu_index < torch.cuda.device_count():
        return None
    props = torch.cuda.get_device_properties(gpu_index)
    domain = getattr(props, "pci_domain_id", None)
    bus = getattr(props, "pci_bus_id", None)
    device = getattr(props, "pci_device_id", None)
    if isinstance(bus, str):
        return normalize_pci_bus_id(bus)
    if isinstance(domain, int) and isinstance(bus, int) and isinstance(device, int):
        # CUDA reports no PCI function; GPUs are function 0.
        return f"{domain:04x}:{bus:02x}:{device:02x}.0"
    return _nvml_bus_id(str(props.uuid))


def _nvml_bus_id(uuid: str) -> str | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        name = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        raw = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByUUID(name)).busId
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return normalize_pci_bus_id(text)


def gpu_local_cpus(gpu_index: int, *, sysfs: Path = Path("/sys")) -> frozenset[int] | None:
    """The CPUs of the NUMA node local to CUDA device ``gpu_index``; ``None`` when unknown.

    Unknown covers CPU-only runs, machines without sysfs PCI entries (containers, VMs) and
    firmware that reports no node; :func:`plan` then falls back with a recorded warning.
    """
    bus_id = gpu_pci_bus_id(gpu_index)
    return None if bus_id is None else pci_local_cpus(bus_id, sysfs=sysfs)


def plan_for_process(
    spec: PinningSpec,
    *,
    workers: int,
    local_ranks: int = 1,
    local_rank: int = 0,
    gpu: int | None = None,
    bound: bool | None = None,
) -> Placement:
    """:func:`plan` for the calling process: its current mask as ``allowed``, sysfs topology.

    Call it at start, before any pinning, so that ``allowed`` is the set the job was given.
    ``bound`` says whether that set is already this rank's own (:func:`task_bound`; ``None``:
    read from ``os.environ``); if so it is neither cut for nor split between the other local
    ranks. ``gpu`` is the rank's GPU either way.
    """
    if bound is None:
        bound = task_bound(os.environ)
    split, index = rank_split(local_ranks, local_rank, bound=bound)
    gpu_cpus = None
    if spec.policy is Policy.NUMA and gpu is not None:
        gpu_cpus = gpu_local_cpus(gpu)
    return plan(
        spec,
        allowed=budget_cut(os.sched_getaffinity(0), spec.cpus, split),
        workers=workers,
        local_ranks=split,
        local_rank=index,
        gpu=gpu,
        gpu_cpus=gpu_cpus,
        rank=local_rank if bound else None,
    )


# ---------------------------------------------------------------------------------------------
# Threads (impure)


@dataclass(frozen=True, kw_only=True)
class ThreadInfo:
    tid: int
    pid: int
    name: str
    role: Role


@dataclass(frozen=True, kw_only=True)
class ThreadRow:
    """One thread's planned and actual CPU mask, as cpulists; ``cpus_planned`` "" = unplanned."""

    tid: int
    pid: int
    role: Role
    name: str
    cpus_planned: str
    cpus_actual: str


_PIN_MEMORY_NAME = "pt_data_pin"
_WORKER_NAME = "pt_data_worker"
_COMM_PREFIXES = ("pt_nccl", "NCCL", "pt_gloo", "gloo", "pt_tcpstore")
_COMM_PARTS = ("gloo", "ProcessGroup")


def classify_thread(name: str, *, is_main: bool, is_pin_memory: bool = False) -> Role:
    """The role of a thread of a rank process from its native name (see the module docstring)."""
    if is_main:
        return Role.LAUNCH
    if is_pin_memory:
        return Role.PIN_MEMORY
    if name.startswith("pt_autograd"):
        return Role.AUTOGRAD
    if name == _PIN_MEMORY_NAME:
        return Role.PIN_MEMORY
    if name.startswith(_COMM_PREFIXES) or any(part in name for part in _COMM_PARTS):
        return Role.COMM
    return Role.OTHER


def _pin_memory_tids() -> frozenset[int]:
    # DataLoader names nothing: Python's default name "Thread-N (_pin_memory_loop)" carries the
    # target's name, and that is the only handle on the thread there is.
    return frozenset(
        t.native_id
        for t in threading.enumerate()
        if "pin_memory" in t.name and t.native_id is not None
    )


def _task_ids(pid: int) -> list[int]:
    try:
        entries = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        raise ProcessLookupError(f"no process {pid} in /proc") from None
    return sorted(int(e.name) for e in entries if e.name.isdigit())


def _thread_name(pid: int, tid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().rstrip("\n")
    except (FileNotFoundError, ProcessLookupError):
        return None  # the thread exited between listing and reading


def discover_threads(pid: int | None = None, *, loader: bool = False) -> list[ThreadInfo]:
    """The threads of process ``pid`` (default: this one) with their roles, sorted by TID.

    All threads of a loader worker get role ``loader``: of a process whose main thread is named
    ``pt_data_worker``, or of any process with ``loader=True`` (a worker of a torch that does not
    name it). On old torch the pin-memory thread is recognised only in the calling process.
    """
    pid = os.getpid() if pid is None else pid
    pinners = _pin_memory_tids() if pid == os.getpid() else frozenset()
    named = [(tid, _thread_name(pid, tid)) for tid in _task_ids(pid)]
    threads = [(tid, name) for tid, name in named if name is not None]
    loader = loader or any(tid == pid and name == _WORKER_NAME for tid, name in threads)
    return [
        ThreadInfo(
            tid=tid,
            pid=pid,
            name=name,
            role=Role.LOADER
            if loader
            else classify_thread(name, is_main=tid == pid, is_pin_memory=tid in pinners),
        )
        for tid, name in threads
    ]


def _row(info: ThreadInfo, planned: frozenset[int] | None) -> ThreadRow | None:
    try:
        actual = os.sched_getaffinity(info.tid)
    except ProcessLookupError:
        return None
    return ThreadRow(
        tid=info.tid,
        pid=info.pid,
        role=info.role,
        name=info.name,
        cpus_planned="" if planned is None else cpulist(planned),
        cpus_actual=cpulist(actual),
    )


def _pin(info: ThreadInfo, cpus: frozenset[int], placement: Placement) -> bool:
    """Pin one thread; ``False`` if it has exited. Never outside the job's allowed set."""
    target = cpus & placement.allowed
    if not target:
        raise PlacementError(
            f"{placement.policy.value}: planned CPUs {_braced(cpus)} for {info.role.value} "
            f"thread {info.tid} ({info.name!r}) lie outside the job's allowed "
            f"{_braced(placement.allowed)}"
        )
    try:
        os.sched_setaffinity(info.tid, target)
    except ProcessLookupError:
        return False
    return True


def record_threads(
    placement: Placement, pid: int | None = None, *, worker_id: int | None = None
) -> list[ThreadRow]:
    """Rows of every thread of ``pid`` with its planned and actual mask; changes nothing.

    ``worker_id`` marks ``pid`` as that loader worker (the main process records its workers by
    the PIDs DataLoader gives it).
    """
    infos = discover_threads(pid, loader=worker_id is not None)
    rows = (_row(i, placement.cpus_for(i.role, worker_id)) for i in infos)
    return [r for r in rows if r is not None]


def apply_threads(placement: Placement, pid: int | None = None) -> list[ThreadRow]:
    """Pin the threads of rank process ``pid`` (default: this one) and return their rows.

    Every thread goes to the CPUs of its role (:meth:`Placement.cpus_for`); the rows carry the
    mask read back after pinning. Idempotent: the harness calls it at start and after step 0.
    Threads that exit meanwhile are skipped. Policy ``none`` only records.
    """
    rows: list[ThreadRow] = []
    for info in discover_threads(pid):
        planned = placement.cpus_for(info.role)
        if planned is not None and not _pin(info, planned, placement):
            continue
        row = _row(info, planned)
        if row is not None:
            rows.append(row)
    return rows


def apply_worker(placement: Placement, worker_id: int) -> list[ThreadRow]:
    """Pin the calling loader worker process, all its threads, to ``placement.workers[id]``.

    Meant for ``worker_init_fn=functools.partial(apply_worker, placement)``. The worker's own
    mask at this point is the one inherited from the thread that forked it (a launch CPU), so
    the bound against widening is ``placement.allowed``, captured by the rank at start, not the
    worker's current mask. Threads the worker creates later inherit the mask of their creator.
    """
    rows: list[ThreadRow] = []
    for info in discover_threads(os.getpid(), loader=True):
        planned = placement.cpus_for(Role.LOADER, worker_id)
        if planned is not None and not _pin(info, planned, placement):
            continue
        row = _row(info, planned)
        if row is not None:
            rows.append(row)
    return rows


def mismatches(rows: Iterable[ThreadRow]) -> list[str]:
    """One line per thread whose actual mask differs from the planned one (unplanned: skipped)."""
    out: list[str] = []
    for r in rows:
        if not r.cpus_planned:
            continue
        planned, actual = parse_cpulist(r.cpus_planned), parse_cpulist(r.cpus_actual)
        if planned != actual:
            out.append(
                f"{r.role.value} thread {r.tid} ({r.name!r}) of pid {r.pid}: planned "
                f"{r.cpus_planned or '-'}, actual {r.cpus_actual or '-'}"
            )
    return out


def crowded(placement: Placement, rows: Iterable[ThreadRow]) -> list[str]:
    """One line per pair of launch roles whose threads' actual masks share a CPU.

    ``rows`` are one reading of the masks (what :func:`apply_threads` returns). Launch roles
    (main, autograd, pin-memory, comm threads) are all busy on the path to the GPU, so two of
    them on one CPU wait for each other; threads of one role (NCCL's several comm threads, one
    autograd thread per device) share their role's CPUs by design and are not reported. Under
    policy ``none`` every mask is the job's whole set and the OS decides: nothing to report.
    """
    if placement.launch is None:
        return []
    by_role: dict[Role, list[tuple[ThreadRow, frozenset[int]]]] = {}
    for r in rows:
        if r.role in LAUNCH_ROLES:
            by_role.setdefault(r.role, []).append((r, parse_cpulist(r.cpus_actual)))
    order = [Role.LAUNCH, *HELPER_ROLES]
    out: list[str] = []
    for i, a in enumerate(order):
        for b in order[i + 1 :]:
            common: set[int] = set()
            seen_a: dict[int, ThreadRow] = {}
            seen_b: dict[int, ThreadRow] = {}
            for ra, ma in by_role.get(a, []):
                for rb, mb in by_role.get(b, []):
                    if ma & mb:
                        common |= ma & mb
                        seen_a[ra.tid], seen_b[rb.tid] = ra, rb
            if common:
                out.append(
                    f"{placement.policy.value}: {a.value} and {b.value} threads share CPU(s) "
                    f"{cpulist(common)}: {_tids(seen_a)} with {_tids(seen_b)}"
                )
    return out


def _tids(rows: dict[int, ThreadRow], most: int = 4) -> str:
    shown = [f"{tid} ({rows[tid].name!r})" for tid in sorted(rows)[:most]]
    more = f" and {len(rows) - most} more" if len(rows) > most else ""
    return ", ".join(shown) + more
