"""Outputs as units: how `codl export`, `codl summarize` (and the summarize rule), the compare
rule and `codl advise` write their files.

A command names its outputs and its inputs before it works (:func:`output_unit`). Each output
is checked first (:func:`check_output`): it is none of the inputs (by path, symlink or hard
link), not a directory, a block device or an existing HDF5 trace, and its directory exists. A
regular file or a new path is then written into a private temporary directory beside it
(``.codl-unit.<unit>.<token>.tmp``, created exclusively: two writers never share a temporary
file, and no temporary name can be an input) and renamed into place only when every output of
the command is written and fsync'ed. A character device or a pipe (``/dev/null``, a FIFO,
``/dev/stdout``, anything reached through ``/proc``) is written in place as a stream: renaming
a file over it would replace the device node or the shell's link.

Several outputs that readers take as one set (summarize's tables, compare's merged tables)
carry a manifest, ``<unit>.unit.json``: the run id (summarize's; compare's spans runs and
gives none) and every member's size and sha256. It is renamed into place *before* the
members, with SIGTERM/SIGINT held back until the last rename, so a write killed at any point
(SIGKILL, power loss) leaves either the old set or a manifest that its members do not match,
never a set that reads as finished; :func:`verify_member` is the readers' check.
Members of the old set that the new one lacks are removed, so two units never mix.

Every output is locked for the write (``exclusive_lock``, purpose ``write``, the same lock a
trace writer takes): a second command writing the same output fails at once.

A write that finds no room (ENOSPC, EDQUOT) anywhere in the unit is one CodlError line naming
the output it was writing; the old outputs stay. The temporary and lock names add bytes to an
output's name; where that would pass NAME_MAX they carry a hash of it instead
(``files.fit_name``), so any name the file system takes can be an output.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from codl.errors import CodlError
from codl.files import (
    NO_ROOM,
    exclusive_lock,
    fit_name,
    fsync_path,
    glob_escape,
    signals_deferred,
)

UNIT_SUFFIX: Final = ".unit.json"
MANIFEST_FORMAT: Final = "codl-output-unit/1"
_TMP_PREFIX: Final = ".codl-unit."
_HDF5_MAGIC: Final = b"\x89HDF\r\n\x1a\n"
_CLASH: Final = "two commands must not write one output at once"


class OutputKind(enum.Enum):
    FILE = "file"  # a regular file or a new path: written beside it, renamed over it
    STREAM = "stream"  # a character device or pipe: written in place, never renamed over


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file: one path after symlinks, or one inode."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links to one inode
    except OSError:
        return False


def _is_hdf5(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(8) == _HDF5_MAGIC
    except OSError:
        return False


def _through_proc(path: Path) -> bool:
    """Whether ``path`` reaches its file through /proc (``/dev/stdout``, ``/dev/fd/N``): such
    a link stands for an open descriptor, not for a name that a rename could replace."""
    p = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on symlinks followed
        if p.startswith("/proc/") or os.path.realpath(os.path.dirname(p)).startswith("/proc/"):
            return True
        if not os.path.islink(p):
            return False
        p = os.path.normpath(os.path.join(os.path.dirname(p), os.readlink(p)))
    return False


def output_kind(output: Path, *, option: str) -> OutputKind:
    """How ``output`` is written: renamed into place, or streamed in place; CodlError naming
    ``option`` for what may not be written at all."""
    try:
        st = os.stat(output)
    except FileNotFoundError:
        if os.path.islink(output):
            raise CodlError(
                f"{option} {output} is a symlink to a missing file; give a path that exists "
                "or a new one"
            ) from None
        if not output.parent.is_dir():
            raise CodlError(
                f"{option} {output}: directory {output.parent} does not exist"
            ) from None
        return OutputKind.FILE
    except OSError as e:
        raise CodlError(f"{option} {output}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise CodlError(f"{option} {output} is a directory, expected a file path")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return OutputKind.STREAM
    if not stat.S_ISREG(st.st_mode):
        raise CodlError(
            f"{option} {output} is neither a regular file, a character device nor a pipe "
            "(a block device? a socket?); refusing to write to it"
        )
    return OutputKind.STREAM if _through_proc(output) else OutputKind.FILE


def check_output(output: Path, *, inputs: Sequence[Path], option: str) -> OutputKind:
    """Refuse an output that is one of ``inputs``, a directory, in a missing directory, a block
    device or an existing HDF5 file (a measurement, which no command of codl writes over as a
    by-product); otherwise say how it is written (:func:`output_kind`)."""
    for inp in inputs:
        if same_file(output, inp):
            raise CodlError(f"{option} {output} is the input {inp}; it would be overwritten")
    kind = output_kind(output, option=option)
    if kind is OutputKind.FILE and _is_hdf5(output):
        raise CodlError(
            f"{option} {output} exists and is an HDF5 file (a trace?); refusing to overwrite it"
        )
    return kind


def check_outputs(outputs: Mapping[str, Path], *, inputs: Sequence[Path]) -> None:
    """:func:`check_output` for each of a command's outputs (option -> path), and no two of
    them one file (the second would overwrite the first)."""
    seen: list[tuple[str, Path]] = []
    for option, path in outputs.items():
        check_output(path, inputs=inputs, option=option)
        for other_option, other in seen:
            if same_file(path, other):
                raise CodlError(f"{option} {path} is also {other_option}; expected two files")
        seen.append((option, path))


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class OutputUnit:
    """A command's outputs on their way: write each to :meth:`path`, never to its final name."""

    members: dict[Path, Path] = field(default_factory=dict)  # final -> where it is written
    streams: set[Path] = field(default_factory=set)
    moves: list[tuple[Path, Path]] = field(default_factory=list)  # (final, temporary)

    def path(self, final: Path) -> Path:
        """Where the output ``final`` is written now (itself for a stream)."""
        try:
            return self.members[Path(final)]
        except KeyError:
            raise CodlError(f"{final}: not an output of this command's unit") from None

    def is_stream(self, final: Path) -> bool:
        return Path(final) in self.streams


@contextlib.contextmanager
def output_unit(
    outputs: Mapping[str, Path] | Sequence[Path],
    *,
    inputs: Sequence[Path] = (),
    manifest: Path | None = None,
    run_id: str = "",
    mkdir: bool = False,
) -> Iterator[OutputUnit]:
    """Write ``outputs`` (option -> path, or paths) as one unit; see the module docstring.

    ``manifest``: the unit's manifest path (every member then in its directory); ``mkdir``:
    create missing output directories. Nothing appears at a final name unless the block
    returns; on any exception the temporary directory is removed and the old outputs stay.
    """
    named = dict(outputs) if isinstance(outputs, Mapping) else {str(p): p for p in outputs}
    if mkdir:
        for path in named.values():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    check_outputs({k: Path(v) for k, v in named.items()}, inputs=inputs)
    unit = OutputUnit()
    files: list[tuple[Path, Path]] = []  # (as given, after symlinks: where it is renamed to)
    for option, path in named.items():
        if output_kind(Path(path), option=option) is OutputKind.STREAM:
            unit.members[Path(path)] = Path(path)
            unit.streams.add(Path(path))
        else:
            files.append((Path(path), Path(os.path.realpath(path))))
    real_manifest = Path(os.path.realpath(manifest)) if manifest is not None else None
    if real_manifest is not None and any(f.parent != real_manifest.parent for _, f in files):
        raise CodlError(f"{manifest}: a unit's members must share its manifest's directory")
    with contextlib.ExitStack() as stack:
        try:
            locked = {f for _, f in files} | ({real_manifest} if real_manifest else set())
            for final in sorted(locked):
                stack.enter_context(exclusive_lock(final, "write", clash=_CLASH))
            tmpdirs = _make_tmpdirs([f for _, f in files], real_manifest)
            stack.callback(_remove_all, list(tmpdirs.values()))
            for given, final in files:
                unit.members[given] = unit.members[final] = tmpdirs[final.parent] / final.name
                unit.moves.append((final, unit.members[final]))
            yield unit
            _commit(unit, tmpdirs, manifest=real_manifest, run_id=run_id)
        except Exception as e:
            # Named here, while the temporary files still say which output was being written
            # (the stack removes them next): a library's ENOSPC names no file, or a temporary.
            # Only text kept: a local bound to the error would tie its traceback (and the
            # files its frames hold open) into a cycle that outlives the command.
            text = _no_room_text(e, unit, [f for _, f in files])
            if text is None:
                raise
            raise CodlError(text) from e


# What a temporary directory's name adds to its unit's: the prefix, "." and the token (a pid
# of at most 7 digits, as pid_max is at most 2**22, "-", 8 hex digits) and ".tmp".
_TMP_AFFIXES: Final = len(_TMP_PREFIX) + len(".") + 7 + 1 + 8 + len(".tmp")


def _unit_name(finals: Sequence[Path], manifest: Path | None) -> str:
    """The unit's part of its temporary names: its manifest's or first output's name,
    shortened where the temporary name would pass NAME_MAX."""
    name = manifest.name if manifest is not None else finals[0].name
    return fit_name(name, extra=_TMP_AFFIXES)


def _no_room(exc: BaseException) -> OSError | None:
    """The ENOSPC/EDQUOT behind ``exc``, if any: itself, or what it was raised from or while
    handling (a library that fails again while cleaning up after the full disk)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_ROOM:
            return e
        e = e.__cause__ or e.__context__
    return None


def _no_room_text(error: BaseException, unit: OutputUnit, finals: Sequence[Path]) -> str | None:
    """One line for a write that found no room (None for another error): the output it was
    writing (the one the error names, else the temporary file written last, else the first)
    and what is kept."""
    exc = _no_room(error)
    if exc is None:
        return None
    by_tmp = {str(tmp): final for final, tmp in unit.moves}
    named = str(exc.filename) if exc.filename is not None else None
    target: Path | None = None
    if named is not None and named in by_tmp:
        target = by_tmp[named]
    elif named is not None and Path(named) in unit.streams:
        target = Path(named)
    else:
        written = []
        for final, tmp in unit.moves:
            with contextlib.suppress(OSError):
                written.append((tmp.stat().st_mtime_ns, final))
        if written:
            target = max(written, key=lambda w: w[0])[1]
    if target is None:
        target = finals[0] if finals else next(iter(sorted(unit.streams)), Path(named or "?"))
    # os.strerror: a library's own text for the error may run to several lines.
    quota = exc.errno == errno.EDQUOT
    why = f"{os.strerror(exc.errno or errno.ENOSPC)} ({'quota' if quota else 'the disk is'} full)"
    if target in unit.streams:
        return f"{target}: {why}; the output is cut short"
    others = " (nor any other output of the command)" if len(unit.moves) > 1 else ""
    return f"{target}: {why}; nothing written at its name{others}, what was there before is kept"


_LEFTOVER = re.compile(r"(\d+)-[0-9a-f]{8}\.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _make_tmpdirs(finals: Sequence[Path], manifest: Path | None) -> dict[Path, Path]:
    """A private temporary directory per output directory; those a killed writer of this unit
    left are removed first (this writer holds the unit's locks, so their writer is gone)."""
    out: dict[Path, Path] = {}
    if not finals:
        return out
    name = _unit_name(finals, manifest)
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    for parent in dict.fromkeys(f.parent for f in finals):
        for stale in parent.glob(f"{glob_escape(_TMP_PREFIX + name)}.*.tmp"):
            # Only this unit's own leftovers: the exact name (a glob's * would also match the
            # live directory of a longer output name) of a writer that is gone.
            m = _LEFTOVER.fullmatch(stale.name.removeprefix(_TMP_PREFIX + name + "."))
            if m is not None and not _alive(int(m.group(1))):
                shutil.rmtree(stale, ignore_errors=True)
        tmp = parent / f"{_TMP_PREFIX}{name}.{token}.tmp"
        tmp.mkdir(mode=0o700)  # exclusive: fails where the name exists
        out[parent] = tmp
    return out


def _remove_all(dirs: Sequence[Path]) -> None:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def _listed(manifest: Path) -> set[str]:
    """The members an existing manifest names (none when it is unreadable: nothing to clear)."""
    try:
        doc = json.loads(manifest.read_text(encoding="utf-8"))
        return {str(n) for n in doc["members"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def _commit(
    unit: OutputUnit,
    tmpdirs: Mapping[Path, Path],
    *,
    manifest: Path | None,
    run_id: str,
) -> None:
    """Rename the written outputs into place: the manifest first, then the members."""
    moves = list(unit.moves)
    for final, tmp in moves:
        if not tmp.is_file():
            raise CodlError(f"{final}: the command did not write this output")
        fsync_path(tmp)
    old: set[str] = set()
    if manifest is not None:
        doc = {
            "format": MANIFEST_FORMAT,
            "run_id": run_id,
            "written_unix_s": round(time.time(), 3),
            "members": {
                f.name: {"bytes": t.stat().st_size, "sha256": sha256_of(t)} for f, t in moves
            },
        }
        tmp_manifest = tmpdirs[manifest.parent] / manifest.name
        tmp_manifest.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", "utf-8")
        fsync_path(tmp_manifest)
        old = _listed(manifest) - {f.name for f, _ in moves}
        moves.insert(0, (manifest, tmp_manifest))
    # A signal between two renames would leave a set that is neither the old nor the new one.
    with signals_deferred():
        for final, tmp in moves:
            os.replace(tmp, final)
        if manifest is not None:
            for name in old:
                with contextlib.suppress(OSError):
                    (manifest.parent / name).unlink()
        for parent in tmpdirs:
            fsync_path(parent)


def manifest_of(member: Path) -> Path | None:
    """The unit manifest beside ``member`` that lists it; None where its directory holds no
    manifest at all (tables written before units); CodlError where manifests exist and none
    lists it (a set some other way, or the leftovers of an interrupted write)."""
    manifests = sorted(member.parent.glob(f"*{UNIT_SUFFIX}"))
    if not manifests:
        return None
    for m in manifests:
        if member.name in _listed(m):
            return m
    raise CodlError(
        f"{member}: no unit manifest in {member.parent} lists it (left by an interrupted or "
        "concurrent write?); write it again"
    )


def verify_unit(manifest: Path, *, only: Sequence[str] | None = None) -> dict[str, Any]:
    """The manifest, after checking that every member it lists is there with its size and
    sha256: a unit read only whole. CodlError naming the first member that is not. ``only``:
    check just these members (a step that rewrites the others from them)."""
    try:
        doc = json.loads(manifest.read_text(encoding="utf-8"))
        members = doc["members"]
        if doc.get("format") != MANIFEST_FORMAT or not isinstance(members, dict):
            raise ValueError("not a codl output-unit manifest")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CodlError(f"{manifest}: unreadable unit manifest ({e})") from None
    for name, entry in members.items():
        if only is not None and name not in only:
            continue
        path = manifest.parent / name
        try:
            ok = path.stat().st_size == entry["bytes"] and sha256_of(path) == entry["sha256"]
        except FileNotFoundError:
            ok = False
        except (OSError, KeyError, TypeError) as e:
            raise CodlError(f"{manifest}: member {name}: {e}") from None
        if not ok:
            raise CodlError(
                f"{path}: missing or not the file its unit manifest {manifest.name} lists (an "
                "interrupted or concurrent write?); write the unit again"
            )
    return dict(doc)


def verify_member(member: Path, *, checked: dict[Path, dict[str, Any]] | None = None) -> str:
    """Check the unit ``member`` belongs to (:func:`verify_unit`, once per manifest in
    ``checked``); returns the unit's run id ("" for tables written before units)."""
    manifest = manifest_of(member)
    if manifest is None:
        return ""
    if checked is None:
        checked = {}
    if manifest not in checked:
        checked[manifest] = verify_unit(manifest)
    return str(checked[manifest].get("run_id", ""))
