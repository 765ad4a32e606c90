"""Start every rank of a run, wherever we are: one process, local ranks, or Slurm tasks.

Under ``srun`` (SLURM_NTASKS > 1) this process *is* one rank and learns its place from submitit's
``JobEnvironment``; outside Slurm, ranks are spawned locally with torch.multiprocessing. The same
spec runs unchanged in both places. Each rank writes ``trace.rank<R>.h5``; rank 0 waits for all
of them and merges them into the run's single ``trace.h5``.
A local run that does not finish (a rank failed, or SIGTERM/SIGINT reached the launcher or its
whole process group, as Slurm's time limit does) leaves exactly one file: ``trace.incomplete.h5``,
every rank's data merged, with the reason and each rank's own; so does a multi-rank run whose
srun step failed (the process that started srun merges what the ranks wrote).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from codl.errors import CodlError, RunInterruptedError, TraceFormatError
from codl.files import exclusive_lock, restore_after_stop
from codl.harness.runner import RankEnv, execute
from codl.log import configure
from codl.spec import DeviceKind, RunSpec
from codl.trace.store import check_trace_target, incomplete_path, open_trace, set_aside_stale
from codl.trace.store.files import PARTIAL_SUFFIX
from codl.trace.store.merge import merge_incomplete_ranks, merge_rank_traces, rank_trace_path

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from torch.multiprocessing.spawn import ProcessException

# How long the other ranks get to stop by themselves (and keep their data) after one failed.
RANK_GRACE_S = 60.0
# Set in the environment of the tasks that `codl run` starts through srun.
SRUN_MARK = "CODL_SRUN_TASK"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cluster_env() -> RankEnv | None:
    """This task's place when a cluster launcher started it as one of several ranks.

    ``srun`` with more than one task, or submitit (its Slurm or local executor): both are read
    through submitit's ``TorchDistributedEnvironment``, which also picks the rendezvous host
    (first node of the job) and a port derived from the job id, identical on every task.
    """
    under_submitit = bool(os.environ.get("SUBMITIT_EXECUTOR"))
    under_srun = bool(os.environ.get(SRUN_MARK)) or (
        int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in os.environ
    )
    if not (under_submitit or under_srun):
        return None
    if not under_submitit:
        # submitit's JobEnvironment recognises Slurm only by SUBMITIT_EXECUTOR=slurm, which its
        # own executor sets; a task of a plain srun has every SLURM_* variable it reads but not
        # that one ("Could not figure out which environment the job is runnning in").
        os.environ["SUBMITIT_EXECUTOR"] = "slurm"
    from submitit.helpers import TorchDistributedEnvironment

    dist_env = TorchDistributedEnvironment()
    return RankEnv(
        rank=dist_env.rank,
        local_rank=dist_env.local_rank,
        world_size=dist_env.world_size,
        local_world_size=dist_env.local_world_size,
        master_addr=dist_env.master_addr,
        master_port=dist_env.master_port,
        # submitit's local executor starts its tasks as children of one process, which share its
        # CPU set even inside a Slurm task that was bound to it.
        spawned=os.environ.get("SUBMITIT_EXECUTOR") == "local",
    )


def _rank_main(
    local_rank: int,
    spec: RunSpec,
    trace_path: Path,
    dataset_dir: Path | None,
    port: int,
    kineto_dir: Path | None,
    launcher: int,
) -> None:
    # A spawned process starts with logging unconfigured; the level travels in the environment.
    configure()
    n = spec.layout.ranks_per_node
    env = RankEnv(
        rank=local_rank,
        local_rank=local_rank,
        world_size=n,
        local_world_size=n,
        master_port=port,
        spawned=True,
    )
    try:
        execute(
            spec,
            trace_path=rank_trace_path(trace_path, local_rank),
            dataset_dir=dataset_dir,
            env=env,
            kineto_dir=kineto_dir,
        )
    except BaseException as exc:
        if os.getppid() != launcher and not isinstance(exc, SystemExit):
            # The launcher died (SIGKILL, the OOM killer) and torch's wrapper had the kernel
            # send this rank SIGINT (PR_SET_PDEATHSIG): its data is in its own incomplete trace.
            # Whatever ended it then (the stop, a KeyboardInterrupt before the stop handler was
            # set, the other rank's collective gone), no one will read or remove the error file
            # the wrapper writes for an exception, which would stay in $TMPDIR; SystemExit
            # passes the wrapper without writing one.
            log.warning("rank %d: its launcher is gone; ended by %s", local_rank, _last_line(exc))
            raise SystemExit(2) from None
        raise


def _last_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[-1]}" if text else type(exc).__name__


def srun_command(spec: RunSpec, argv: list[str], *, cpus_per_task: int) -> list[str]:
    """``srun`` line that starts one task per rank of ``spec`` running ``argv`` again.

    Snakemake's Slurm jobstep strips the SLURM_* task variables before running a rule's command,
    so a bare ``srun`` would start one task: the layout is passed explicitly. CPU binding stays
    Slurm's: with task/affinity each task is bound to its own ``cpus_per_task`` cores, which the
    rank sees (``SLURM_CPU_BIND_TYPE``, :func:`codl.pinning.task_bound`) and takes whole, as a
    set shared by no other rank (trace attribute ``cpus_split`` = 1; ``pinning.cpus`` counted in
    it); without a binding every task sees the node's job set and the ranks split it. The
    CPU-set policy then places the rank's threads inside its CPUs and never widens them.
    """
    cmd = [
        "srun",
        f"--nodes={spec.layout.nodes}",
        f"--ntasks={spec.layout.world_size}",
        f"--ntasks-per-node={spec.layout.ranks_per_node}",
        "--kill-on-bad-exit=1",
    ]
    if cpus_per_task > 0:
        cmd.append(f"--cpus-per-task={cpus_per_task}")
    if spec.device is DeviceKind.CUDA:
        cmd.append("--gpus-per-task=1")
    return [*cmd, *argv]


def launch(
    spec: RunSpec,
    *,
    trace_path: Path,
    dataset_dir: Path | None,
    kineto_dir: Path | None = None,
    argv: list[str] | None = None,
    cpus_per_task: int = 0,
) -> Path:
    """Run every rank of ``spec``. ``argv`` is this process's own command line, re-run under
    ``srun`` when a multi-rank spec starts inside a Slurm job as a single process.

    The trace path is checked and locked before anything is measured: a second run of the same
    trace path fails at once instead of after its measurements (each srun task locks its own
    rank trace; the process that started them holds the run's).
    """
    trace_path = check_trace_target(trace_path)
    env = cluster_env() if spec.layout.world_size > 1 else None
    mine = trace_path if env is None else rank_trace_path(trace_path, env.rank)
    with exclusive_lock(mine, "run"):
        if env is None or env.rank == 0:
            # An earlier attempt's incomplete trace is kept, not replaced by this attempt's.
            set_aside_stale(incomplete_path(trace_path))
        return _launch(
            spec,
            trace_path=trace_path,
            dataset_dir=dataset_dir,
            kineto_dir=kineto_dir,
            argv=argv,
            cpus_per_task=cpus_per_task,
            env=env,
        )


def _launch(
    spec: RunSpec,
    *,
    trace_path: Path,
    dataset_dir: Path | None,
    kineto_dir: Path | None,
    argv: list[str] | None,
    cpus_per_task: int,
    env: RankEnv | None,
) -> Path:
    world = spec.layout.world_size
    if world == 1:
        return execute(spec, trace_path=trace_path, dataset_dir=dataset_dir, kineto_dir=kineto_dir)
    if env is None:
        for r in range(world):
            _set_aside_stale_rank(trace_path, r)
    if env is None and os.environ.get("SLURM_JOB_ID") and argv and not os.environ.get(SRUN_MARK):
        import subprocess

        cmd = srun_command(spec, argv, cpus_per_task=cpus_per_task)
        proc = subprocess.run(cmd, env={**os.environ, SRUN_MARK: "1"}, check=False)
        if proc.returncode != 0:
            # What the ranks wrote before they stopped (a rank's own trace, complete or
            # incomplete), merged into the run's one incomplete trace, as a local run does.
            why = f"srun exited with {proc.returncode}"
            kept = merge_incomplete_ranks(
                trace_path,
                world,
                reason=why,
                run_id=spec.run_id,
                compression=spec.trace.compression,
            )
            raise CodlError(
                f"{why}: {' '.join(cmd)}; what the ranks measured is kept in {kept or 'no file'}"
            )
        if not trace_path.exists():
            raise TraceFormatError(f"{trace_path}: srun finished but rank 0 wrote no trace")
        return trace_path
    if env is not None:
        if env.world_size != world:
            raise CodlError(
                f"spec asks for {world} ranks (layout.nodes x layout.ranks_per_node) but srun "
                f"started {env.world_size} tasks"
            )
        _set_aside_stale_rank(trace_path, env.rank)
        execute(
            spec,
            trace_path=rank_trace_path(trace_path, env.rank),
            dataset_dir=dataset_dir,
            env=env,
            kineto_dir=kineto_dir,
        )
        if env.rank == 0:
            merge_rank_traces(
                trace_path, world, run_id=spec.run_id, compression=spec.trace.compression
            )
        return trace_path
    if spec.layout.nodes > 1:
        raise CodlError(
            f"layout.nodes={spec.layout.nodes} needs a multi-node launcher: run it under Slurm "
            "(snakemake --profile profiles/slurm), which starts one task per rank with srun"
        )
    return _spawn_local(spec, trace_path, dataset_dir, kineto_dir)


def _set_aside_stale_rank(trace_path: Path, rank: int) -> None:
    """Keep what an earlier attempt's rank ``rank`` left (its trace, complete or incomplete)
    under a stale name: never merged as this attempt's, and an incomplete one never taken for
    this attempt's rank having failed (merge_rank_traces stops waiting when it sees one)."""
    part = rank_trace_path(trace_path, rank)
    for p in (part, incomplete_path(part)):
        set_aside_stale(p)


def _spawn_local(
    spec: RunSpec, trace_path: Path, dataset_dir: Path | None, kineto_dir: Path | None
) -> Path:
    """Every rank as a local process; their traces merged into one, complete or (a rank failed,
    or the run was signalled) incomplete."""
    world = spec.layout.world_size
    from torch.multiprocessing.spawn import (
        ProcessExitedException,
        ProcessRaisedException,
        start_processes,
    )

    port = _free_port()
    pids: list[int] = []
    context: Any = None
    with _forwarded_stop(pids) as stopped:
        try:
            context = start_processes(
                _rank_main,
                args=(spec, trace_path, dataset_dir, port, kineto_dir, os.getpid()),
                nprocs=world,
                join=False,
                start_method="spawn",
            )
            pids += [proc.pid for proc in context.processes if proc.pid is not None]
            # When a rank dies, the others fail in their next collective and write what they
            # measured; torch's default sends them SIGTERM at once and SIGKILL 30 s later,
            # which can kill a survivor still blocked in a collective before it has written.
            while not context.join(grace_period=RANK_GRACE_S):
                pass
        except (ProcessExitedException, ProcessRaisedException) as exc:
            why = f"received {stopped[0]}" if stopped else _rank_failure(exc, world)
            kept = merge_incomplete_ranks(
                trace_path,
                world,
                reason=why,
                run_id=spec.run_id,
                compression=spec.trace.compression,
            )
            unsealed = "".join(
                f"; a killed rank's unsealed trace is kept in {p} (open_trace allow_incomplete)"
                for p in _clean_after_ranks(trace_path, context)
            )
            error = RunInterruptedError if stopped else CodlError
            raise error(
                f"{why}; what the ranks measured is kept in {kept or 'no file'}{unsealed}"
            ) from exc
        finally:
            if context is not None:
                _clean_after_ranks(trace_path, context)
        return merge_rank_traces(
            trace_path, world, run_id=spec.run_id, compression=spec.trace.compression
        )


def _rank_failure(exc: ProcessException, world: int) -> str:
    """How the first rank that ended badly ended, in one line: the signal that killed it (pid
    included, to find it in the kernel log after an OOM kill), its exit status, or the last
    line of the exception it raised (its traceback is above, in the rank's stderr)."""
    from torch.multiprocessing.spawn import ProcessExitedException

    rank = f"rank {exc.error_index} of {world} failed"
    if isinstance(exc, ProcessExitedException):
        if exc.signal_name:
            return f"{rank}: killed by {exc.signal_name} (pid {exc.error_pid})"
        return f"{rank}: exited with status {exc.exit_code} (pid {exc.error_pid})"
    return f"{rank}: {str(exc).strip().splitlines()[-1]}"


def _clean_after_ranks(trace_path: Path, context: Any) -> list[Path]:
    """Remove what the ended ranks of a local run leave behind: torch's per-rank error files
    (``$TMPDIR/pytorch-errorfile-*.pickle``, written by a rank that raised, never removed by
    torch), and a killed rank's streaming partial trace and write lock. Returns the partial
    traces kept because they can be read (none in practice).

    A rank killed (SIGKILL, the OOM killer) has no say: its partial file was never sealed and
    HDF5 has not written the metadata that would make it readable (the writer's ``flush()``
    does, and the harness never calls it), and its lock would stay beside the run's files. The
    partial is named after the writer's pid (``trace.rank<R>.h5.<pid>-<random>.partial``), so
    only the dead rank's own is touched; the lock is taken and released as any writer does,
    which removes it (a live holder of that path would keep it).
    """
    kept: list[Path] = []
    for f in context.error_files:
        with contextlib.suppress(OSError):
            os.unlink(f)
    for r, proc in enumerate(context.processes):
        if proc.pid is None or proc.exitcode is None:
            continue  # never started, or still running (it holds its files)
        part = rank_trace_path(trace_path, r)
        for p in part.parent.glob(f"{glob.escape(part.name)}.{proc.pid}-*{PARTIAL_SUFFIX}"):
            try:
                open_trace(p, allow_incomplete=True).close()
                kept.append(p)
            except (OSError, TraceFormatError, KeyError, ValueError):
                p.unlink(missing_ok=True)
        with contextlib.suppress(TraceFormatError), exclusive_lock(part, "write"):
            pass
    return kept


@contextlib.contextmanager
def _forwarded_stop(pids: list[int]) -> Iterator[list[str]]:
    """While local ranks run: SIGTERM/SIGINT to the launcher is passed on to the ranks and
    remembered (the yielded list gets the signal's name), never raised here.

    Slurm's time limit and Ctrl-C signal the whole process group: the launcher must outlive its
    ranks, which stop and write their data, so that it can merge what they measured into one
    incomplete trace. A signal sent to the launcher alone reaches the ranks this way; a rank
    that got it from the group too ignores the repeat (runner._StopHandler). The handlers from
    before come back behind codl.files.restore_after_stop's grace handler.
    """
    stopped: list[str] = []
    first: list[float] = []
    if threading.current_thread() is not threading.main_thread():
        yield stopped  # signal handlers can only be set from the main thread
        return

    def forward(signum: int, frame: FrameType | None) -> None:
        first[:] = first or [time.monotonic()]
        stopped.append(signal.Signals(signum).name)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    handler: Callable[[int, FrameType | None], None] = forward
    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stopped
    finally:
        # After a stop, the kill's repeats stay ignored for a while: the launcher ends with the
        # merged trace and exit status 2, not by the signal.
        restore_after_stop(previous, first[0] if first else None)
