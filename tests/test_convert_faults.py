"""`codl convert` (a trace copied with another codec) against bad inputs, bad outputs, a kill
mid-write and a second convert at once; `codl export` against a trace whose contents no longer
match its column digests. Every refusal is one line, ``codl <command>: error: ...``, naming the
file and what was expected, exit status 2, no traceback, and nothing written."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from codl.cli import main
from codl.errors import TraceFormatError
from codl.trace.store import TraceWriter, open_trace
from test_export import BASE, write_trace

SRC = Path(__file__).resolve().parents[1] / "src"


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    """Run ``codl ARGV``: exit 2 and one line holding every fragment, no traceback."""
    assert main(argv) == 2, argv
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"codl {argv[0]}: error: "), lines
    assert "Traceback" not in captured.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert captured.out == ""
    return lines[0]


def leftovers(directory: Path) -> list[str]:
    """Hidden names a writer leaves while it works: its temporary directory, its lock."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


# --- bad inputs ---------------------------------------------------------------------------


def _flip_a_chunk_byte(trace: Path) -> None:
    """One byte in the middle of a stored chunk of /events/app/start_ns: HDF5's fletcher32
    fails on read."""
    with h5py.File(trace, "r") as f:
        info = f["events/app/start_ns"].id.get_chunk_info(0)
    at = info.byte_offset + info.size // 2
    with trace.open("r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([byte ^ 0xFF]))


def _rewrite_a_value(trace: Path) -> None:
    """A value changed through HDF5: its chunk checksum is valid, the column digest is not."""
    with h5py.File(trace, "r+") as f:
        f["events/app/step"][1] = 77


def _truncate(trace: Path) -> None:
    data = trace.read_bytes()
    trace.write_bytes(data[: len(data) // 2])


def _not_a_trace(trace: Path) -> None:
    trace.unlink()
    with h5py.File(trace, "w") as f:
        f["x"] = np.arange(3)


def _incomplete(trace: Path) -> None:
    """What an aborted run keeps (``<stem>.incomplete.h5``), under the trace's name."""
    with TraceWriter(trace.with_name("aborted.h5")) as w:
        w.set_attrs(run_id="k1ll3d")
        kept = w.abort("stopped by the test")
    assert kept is not None
    kept.replace(trace)


# name -> (how the trace at the path is spoiled, what the error says)
BAD_INPUTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "text": (lambda p: p.write_text("not a trace\n"), "not an HDF5 file"),
    "empty": (lambda p: p.write_bytes(b""), "not an HDF5 file"),
    "truncated": (_truncate, "truncated or corrupt"),
    "HDF5 but no trace": (_not_a_trace, "not a codl trace"),
    "incomplete": (_incomplete, "incomplete trace"),
    "a flipped chunk byte": (_flip_a_chunk_byte, "/events/app/start_ns is unreadable"),
    "a column that no longer matches its digest": (
        _rewrite_a_value,
        "/events/app/step does not match its crc32; corrupt",
    ),
    "missing": (lambda p: p.unlink(), "no such trace file"),
}


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    d = tmp_path / "in dir ✓"
    d.mkdir()
    return write_trace(d / "trace.h5", t_begin_ns=BASE)


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_convert_refuses_a_bad_input(
    trace: Path, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spoil, expected = BAD_INPUTS[case]
    spoil(trace)
    out = tmp_path / "out.h5"
    refused(["convert", str(trace), "-o", str(out)], capsys, f"{trace}: ", expected)
    assert not out.exists() and leftovers(tmp_path) == []


def test_convert_says_a_kineto_trace_is_no_codl_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`codl convert` changes a codl trace's codec; a Kineto trace is turned into rows by the
    run that recorded it (codl.trace.kineto). Given one, it says so."""
    kineto = Path(__file__).parent / "fixtures" / "kineto-2rank" / "rank0.pt.trace.json.gz"
    if not kineto.is_file():
        pytest.skip(f"{kineto} is absent (scripts/kineto_fixture.py makes it)")
    src = tmp_path / kineto.name
    shutil.copy(kineto, src)
    out = tmp_path / "out.h5"
    refused(
        ["convert", str(src), "-o", str(out)],
        capsys,
        f"{src}: a JSON file (a Kineto or Chrome trace?), expected a codl trace (HDF5)",
    )
    assert not out.exists()


@pytest.mark.parametrize("fmt", ["chrome-json", "perfetto-proto"])
@pytest.mark.parametrize(
    "case", ["a flipped chunk byte", "a column that no longer matches its digest"]
)
def test_export_refuses_a_damaged_trace(
    trace: Path, tmp_path: Path, fmt: str, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every reader refuses a trace whose contents no longer match their checksums: export too,
    whole or windowed (a window reads only some chunks; the digest is the whole column's)."""
    if fmt == "perfetto-proto":
        pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    spoil, expected = BAD_INPUTS[case]
    spoil(trace)
    out = tmp_path / "out.trace"
    argv = ["export", str(trace), "-o", str(out), "--format", fmt]
    refused(argv, capsys, f"{trace}: ", expected)
    # A window is refused too: a column's digest covers all its rows, not a window's chunks.
    refused([*argv, "--from", "25us", "--to", "40us"], capsys, f"{trace}: ", expected)
    assert not out.exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("command", ["convert", "export"])
@pytest.mark.parametrize("kind", ["directory", "device", "fifo"])
def test_a_trace_argument_that_is_no_file(
    tmp_path: Path, command: str, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if kind == "directory":
        path, expected = tmp_path / "run", "is a directory, expected a trace file"
        path.mkdir()
    elif kind == "device":
        path, expected = Path(os.devnull), "not a regular file"
    else:
        path, expected = tmp_path / "pipe.h5", "not a regular file"
        os.mkfifo(path)  # never opened: a reader would block on it
    out = tmp_path / "out.h5"
    refused([command, str(path), "-o", str(out)], capsys, f"{path}: ", expected)
    assert not out.exists()


# --- bad outputs --------------------------------------------------------------------------


def _output(trace: Path, case: str) -> tuple[Path, str]:
    d = trace.parent
    if case == "the input":
        return trace, "is the input"
    if case == "a symlink to the input":
        (d / "link.h5").symlink_to(trace)
        return d / "link.h5", "is the input"
    if case == "a hard link to the input":
        os.link(trace, d / "hard.h5")
        return d / "hard.h5", "is the input"
    if case == "the input via ..":
        (d / "sub").mkdir()
        return d / "sub" / ".." / trace.name, "is the input"
    if case == "/dev/null":
        return Path(os.devnull), "is a device or pipe; a trace is an HDF5 file"
    if case == "a fifo":
        os.mkfifo(d / "fifo.h5")
        return d / "fifo.h5", "is a device or pipe; a trace is an HDF5 file"
    if case == "a directory":
        (d / "out").mkdir()
        return d / "out", "is a directory, expected a file path"
    if case == "another trace":
        shutil.copy(trace, d / "other.h5")
        return d / "other.h5", "exists and is an HDF5 file"
    assert case == "in a missing directory"
    return d / "missing" / "out.h5", "does not exist"


OUTPUTS = [
    "the input",
    "a symlink to the input",
    "a hard link to the input",
    "the input via ..",
    "/dev/null",
    "a fifo",
    "a directory",
    "another trace",
    "in a missing directory",
]


@pytest.mark.parametrize("case", OUTPUTS)
def test_convert_refuses_a_bad_output(
    trace: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out, expected = _output(trace, case)
    before = {p: p.read_bytes() for p in trace.parent.iterdir() if p.is_file()}
    refused(["convert", str(trace), "-o", str(out)], capsys, f"-o/--output {out}", expected)
    assert {p: p.read_bytes() for p in trace.parent.iterdir() if p.is_file()} == before
    assert leftovers(trace.parent) == []
    with open_trace(trace) as t:  # the input as it was
        t.verify()


# --- a kill mid-write, two converts at once ----------------------------------------------


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 Mi rows of events/comm with random sizes (~16 MB; the copy takes ~1 s here)."""
    path = tmp_path_factory.mktemp("big") / "big.h5"
    rng = np.random.default_rng(0)
    n, block = 3 << 20, 1 << 20
    with TraceWriter(path) as w:
        w.set_attrs(run_id="b1gtr4", t_begin_ns=0)
        for lo in range(0, n, block):
            i = np.arange(lo, lo + block, dtype=np.int64)
            w.append(
                "events/comm",
                {
                    "rank": np.zeros(block, np.int16),
                    "step": (i // 100).astype(np.int32),
                    "bucket": (i % 7).astype(np.int32),
                    "op": np.full(block, "allreduce", dtype=object),
                    "bytes": rng.integers(0, 1 << 40, block),
                    "start_ns": i * 1000,
                    "end_ns": i * 1000 + 500,
                    "gpu_ns": np.full(block, -1, np.int64),
                },
            )
        return w.finish()


def _convert(src: Path, out: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.Popen(
        [sys.executable, "-m", "codl.cli", "convert", str(src), "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _same_trace(a: Path, b: Path) -> None:
    with open_trace(a) as x, open_trace(b) as y:
        y.verify()
        assert x.tables() == y.tables()
        for name in x.tables():
            assert x.table(name).equals(y.table(name)), name


def test_a_convert_killed_mid_write_leaves_no_output(big_trace: Path, tmp_path: Path) -> None:
    """SIGKILL while the copy is written: no file at the output's name (the copy lives in a
    hidden temporary directory until it is complete and verified). A kill runs no cleanup, so
    the temporary directory and the lock stay until the next convert to that output, which
    removes them: after it, nothing but the input and the finished copy."""
    src = tmp_path / "in.h5"
    shutil.copy(big_trace, src)
    out = tmp_path / "out.h5"
    proc = _convert(src, out)
    deadline = time.monotonic() + 120
    partial: list[Path] = []
    while not partial and proc.poll() is None and time.monotonic() < deadline:
        partial = [p for p in tmp_path.glob(".codl-unit.out.h5.*.tmp/out.h5") if p.stat().st_size]
        time.sleep(0.002)
    assert partial and proc.poll() is None, "the copy was never seen on its way"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    left = leftovers(tmp_path)
    assert left and all(n.startswith((".codl-unit.out.h5.", ".out.h5.")) for n in left), left
    # What the kill left is no trace: its copy is half written, and never at the output's name.
    for h5 in tmp_path.glob(".codl-unit.*/*.h5"):
        with pytest.raises(TraceFormatError), open_trace(h5) as t:
            t.verify()

    again = _convert(src, out)
    stdout, stderr = again.communicate(timeout=300)
    assert again.returncode == 0, stderr
    assert stdout.strip() == str(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.h5", "out.h5"]
    _same_trace(src, out)


def test_two_converts_to_one_output_give_one_whole_copy(big_trace: Path, tmp_path: Path) -> None:
    """Started together: one writes the copy, the other is refused at once (the output's
    write lock, or, once the first is done, the finished trace at its name); never a mix."""
    src = tmp_path / "in.h5"
    shutil.copy(big_trace, src)
    out = tmp_path / "out.h5"
    procs = [_convert(src, out), _convert(src, out)]
    results = [(*p.communicate(timeout=300), p.returncode) for p in procs]
    assert sorted(rc for _, _, rc in results) in ([0, 2], [0, 0]), results
    why = (f"-o/--output {out} exists and is an HDF5 file", f"{out}: another writer holds it")
    for _, err, rc in results:
        if rc == 2:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in err, err
            assert lines[0].startswith(tuple(f"codl convert: error: {w}" for w in why)), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.h5", "out.h5"]
    _same_trace(src, out)
