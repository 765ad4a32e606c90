"""File safety every writer of codl shares: locks, signals held back, fsync.

A lock is ``.<final name>.<purpose>.lock`` beside the file it guards (``exclusive_lock``);
``signals_deferred`` holds SIGTERM/SIGINT back while files change hands. The trace store
(``codl.trace.store.files``) and the output units (``codl.outputs``) build on these.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, Final

from codl.errors import TraceFormatError

# What a write that finds no room fails with: a full disk, or the user's quota used up.
NO_ROOM: Final = frozenset({errno.ENOSPC, errno.EDQUOT})

# The longest name of one directory entry, in bytes, on every file system codl writes to
# (ext4, xfs, tmpfs, Lustre, NFS): POSIX NAME_MAX.
NAME_MAX: Final = 255
_HASHED_HEX: Final = 16  # of a long name's sha256: 64 bits, no collision among one directory's


def fit_name(name: str, *, extra: int) -> str:
    """``name`` as a part of a name made from it (a prefix and suffix of ``extra`` bytes in all
    around it): itself where the whole fits NAME_MAX, else a prefix of it and ``~`` and 16 hex
    digits of the sha256 of all of it, so that the made name fits and stays the same for every
    process that makes it (a lock must be one file for all its writers) and its own for each
    ``name``. The prefix ends on a whole UTF-8 character and only helps a person reading it."""
    raw = os.fsencode(name)
    if len(raw) + extra <= NAME_MAX:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:_HASHED_HEX]
    room = max(0, NAME_MAX - extra - len(digest) - 1)
    return f"{raw[:room].decode('utf-8', 'ignore')}~{digest}"


def lock_path(final: str | os.PathLike[str], purpose: str) -> Path:
    """The hidden lock file of ``final`` for ``purpose`` (``write``: TraceWriter; ``run``: a
    whole measured run): ``.<final name>.<purpose>.lock``, the name shortened (:func:`fit_name`)
    where that would pass NAME_MAX."""
    p = Path(final)
    affixes = len(f"..{purpose}.lock".encode())
    return p.with_name(f".{fit_name(p.name, extra=affixes)}.{purpose}.lock")


@contextlib.contextmanager
def exclusive_lock(
    final: str | os.PathLike[str],
    purpose: str,
    *,
    clash: str = "two runs must not share one trace path",
) -> Iterator[Path]:
    """Hold an exclusive lock on trace path ``final`` for ``purpose``, or fail at once (the
    error ends with ``clash``, what the user did wrong).

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
            hint = "the disk is full" if e.errno in NO_ROOM else "is the directory writable?"
            raise TraceFormatError(
                f"{final}: cannot create the lock file {lock} ({e.strerror or e}); {hint}"
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise TraceFormatError(
                f"{final}: another {purpose}r holds it ({holder}; lock {lock}); {clash}"
            ) from None
        try:
            same = os.stat(lock).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        # The holder's name only serves a second writer's message; on a full disk the lock
        # holds without it, and the command goes on to fail (or not) on its own writes.
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
        yield lock
    finally:
        # Unlink while still holding the lock, then release: see the docstring.
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


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


# How long after a stop the repeats of its kill are ignored: Slurm and group-wide kills deliver
# several SIGTERMs within milliseconds; a signal later than this is a new one.
REPEAT_IGNORE_S: Final = 5.0


def restore_after_stop(previous: Mapping[signal.Signals, Any], first: float | None) -> None:
    """Put the stop signals' handlers from before a run (or launch) back; after a stop taken at
    monotonic time ``first``, behind a grace handler that still ignores the kill's repeats.

    Code that stopped and wrote its data is past this point before a kill's later SIGTERMs
    arrive, and the default handler would then end the process by the signal instead of its
    orderly exit status 2. A signal later than REPEAT_IGNORE_S is a new one: it goes to the
    handler that was there before.
    """
    for s, handler in previous.items():
        signal.signal(s, handler if first is None else _grace(handler, first))


def _grace(handler: Any, first: float) -> Callable[[int, FrameType | None], None]:
    def grace(signum: int, frame: FrameType | None) -> None:
        if time.monotonic() - first < REPEAT_IGNORE_S:
            return
        # A new signal, not a repeat: what was there before handles it.
        signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        signal.raise_signal(signum)

    return grace


def glob_escape(name: str) -> str:
    """``name`` with glob metacharacters bracketed, to match itself in ``Path.glob``."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def fsync_path(path: Path) -> None:
    """fsync(2) a file or directory by path: its data, or a directory's entries."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
