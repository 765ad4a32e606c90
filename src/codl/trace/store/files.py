"""File safety of the trace store: where unfinished traces live (locks, signals and fsync are
``codl.files``', for every command that writes).

A trace on its way is ``<final>.<token>.partial``, an aborted one ``<stem>.incomplete.h5``, a
lock ``.<final name>.<purpose>.lock``, and a trace of an earlier attempt set aside is
``<stem>.stale-<mtime_ns><suffix>``; nothing here knows HDF5.
"""

from __future__ import annotations

import itertools
import os
import tempfile
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
        except OSError:
            # A file system without hard links: claim the name by an exclusive create, then
            # move the trace over the empty file that holds it.
            try:
                stale.open("x").close()
            except FileExistsError:
                continue
            os.replace(path, stale)
            return stale
        os.unlink(path)
        return stale
    raise AssertionError("unreachable: itertools.count never ends")  # pragma: no cover
