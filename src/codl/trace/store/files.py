"""File safety of the trace store: where unfinished traces live, locks, signals, fsync.

A trace on its way is ``<final>.<token>.partial``, an aborted one ``<stem>.incomplete.h5``, a
lock ``.<final name>.<purpose>.lock``, and a trace of an earlier attempt set aside is
``<stem>.stale-<mtime_ns><suffix>``; nothing here knows HDF5.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from codl.errors import TraceFormatError

PARTIAL_SUFFIX: Final = ".partial"
INCOMPLETE_SUFFIX: Final = ".incomplete.h5"


def partial_path(final: str | os.PathLike[str], token: str = "") -> Path:
    """Where a trace is written on its way to ``final``: ``<final>[.<token>].partial``.

    Writers pass a token unique to them, so two writers of one path never write one file.
    """
    p = Path(final)
    return p.with_name(p.name + (f".{token}" if token else "") + PARTIAL_SUFFIX)


def lock_path(final: str | os.PathLike[str], purpose: str) -> Path:
    """The hidden lock file of ``final`` for ``purpose`` (``write``: TraceWriter; ``run``: a
    whole measured run): ``.<final name>.<purpose>.lock``."""
    p = Path(final)
    return p.with_name(f".{p.name}.{purpose}.lock")


@contextlib.contextmanager
def exclusive_lock(final: str | os.PathLike[str], purpose: str) -> Iterator[Path]:
    """Hold an exclusive lock on trace path ``final`` for ``purpose``, or fail at once.

    flock(2) on a lock file next to the trace: released by the kernel when the holder dies (a
    SIGKILLed run never blocks the next one), and honoured across nodes by Lustre and NFSv4.
    The file is removed on release; a holder re-checks after locking that the file it locked is
    still the one at the path, since the previous holder may have removed it in between.
    """
    lock = lock_path(final, purpose)
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise TraceFormatError(
                f"{final}: cannot create the lock file {lock} ({e.strerror or e}); is the "
                "directory writable?"
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise TraceFormatError(
                f"{final}: another {purpose}r holds it ({holder}; lock {lock}); two runs must "
                "not share one trace path"
            ) from None
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
        yield lock
    finally:
        # Unlink while still holding the lock, then release: see the docstring.
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def incomplete_path(final: str | os.PathLike[str]) -> Path:
    """Where an aborted trace is kept: ``<final stem>.incomplete.h5`` next to ``final``."""
    p = Path(final)
    return p.with_name(p.stem + INCOMPLETE_SUFFIX)


def check_trace_target(final: str | os.PathLike[str]) -> Path:
    """Check, before a run starts, that its trace can be written at ``final``.

    A run that measures for an hour and then finds its directory read-only or its name illegal
    has lost the hour; this creates the directory and a probe file in it, and raises a
    TraceFormatError naming the path otherwise.
    """
    p = Path(final)
    if p.name.endswith((INCOMPLETE_SUFFIX, PARTIAL_SUFFIX, ".lock")) or not p.name:
        raise TraceFormatError(
            f"{p}: a trace name must not end in {INCOMPLETE_SUFFIX!r}, {PARTIAL_SUFFIX!r} or "
            "'.lock'; those names mark unfinished traces and locks"
        )
    if p.is_dir():
        raise TraceFormatError(f"{p} is a directory, expected a trace file path")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=p.parent):
            pass
    except OSError as e:
        raise TraceFormatError(
            f"{p}: the trace cannot be written in {p.parent} ({e.strerror or e}); fix the "
            "path before the run, not after"
        ) from e
    return p


# The signals a run turns into exceptions (harness.runner); deferred while rows change hands.
DEFERRED_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGTERM/SIGINT back for the block, and re-raise them after it.

    A Python signal handler that raises can fire between any two bytecodes; inside a block
    write or a recorder's hand-over that would leave columns of different lengths or a digest
    that hashed some rows twice. The handlers are swapped for one that only notes the signal
    (a thread mask would not do: the process's other threads would still take it), and a
    noted signal is raised again once the old handlers are back. Outside the main thread,
    where handlers cannot be set (and never run), the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    old = {
        s: signal.signal(s, lambda signum, _frame: caught.append(signum)) for s in DEFERRED_SIGNALS
    }
    try:
        yield
    finally:
        for s, handler in old.items():
            # None: a handler set outside Python, which cannot be put back; the default then.
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


def glob_escape(name: str) -> str:
    """``name`` with glob metacharacters bracketed, to match itself in ``Path.glob``."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_image(image: bytes, path: Path) -> None:
    """Write a finished in-memory HDF5 image and fsync it (OSError on a full disk)."""
    with path.open("wb") as fh:
        fh.write(image)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(directory: Path) -> None:
    # The rename is only durable once the directory entry is; without this a power loss can
    # bring back the .partial name (or nothing) after finish() returned.
    _fsync_path(directory)


def set_aside_stale(path: Path) -> Path | None:
    """Move a trace left by an earlier attempt out of this attempt's way, keeping it as
    ``<stem>.stale-<mtime_ns><suffix>`` (``-2``, ``-3``... before the suffix when that name is
    taken): the project's one scheme for stale traces (run ranks, shared-node jobs).

    A leftover ``trace.rank1.h5`` would otherwise be merged as this attempt's rank 1 (same
    run_id: same spec). Its measurements are kept under a name no merge reads, and never over
    another kept one: the name is claimed by a hard link, which fails where it exists.
    """
    if not path.exists():
        return None
    stem = f"{path.stem}.stale-{path.stat().st_mtime_ns}"
    for n in itertools.count(1):
        stale = path.with_name(f"{stem}{'' if n == 1 else f'-{n}'}{path.suffix}")
        try:
            os.link(path, stale)
        except FileExistsError:
            continue
        os.unlink(path)
        return stale
    raise AssertionError("unreachable: itertools.count never ends")  # pragma: no cover
