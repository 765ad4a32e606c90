"""Killed, failed or damaged runs lose nothing measured and never look complete."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from codl.analysis.summarize import summarize_trace
from codl.datasets import generate
from codl.errors import TraceFormatError
from codl.harness.launch import launch
from codl.harness.runner import write_spec_json
from codl.spec import DatasetSpec, RunSpec
from codl.trace.store import incomplete_path, open_trace

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rel") / "jpeg"
    generate(DatasetSpec(samples=32, height=40, width=48), out)
    return out


def spec(measured: int) -> RunSpec:
    return RunSpec.from_dict(
        {
            "mode": "combined",
            "workload": {"batch_size": 4, "image_size": 32},
            "dataset": {"samples": 32, "height": 40, "width": 48},
            "loader": {"workers": 1},
            "steps": {"warmup": 1, "measured": measured},
        }
    )


def start_run(tmp_path: Path, dataset: Path, measured: int) -> tuple[subprocess.Popen[str], Path]:
    run_dir = tmp_path / "run"
    s = spec(measured)
    write_spec_json(s, run_dir / "spec.json")
    trace = run_dir / "trace.h5"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "codl.cli",
            "run",
            str(run_dir / "spec.json"),
            "--dataset-dir",
            str(dataset),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, trace


def wait_for_steps(proc: subprocess.Popen[str], seconds: float) -> None:
    # Long enough for imports, model build and several steps; the run has thousands left.
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"run ended early: {proc.communicate()}")
        time.sleep(0.2)


def test_sigterm_keeps_what_was_measured_in_a_trace_marked_incomplete(
    tmp_path: Path, dataset: Path
) -> None:
    proc, trace = start_run(tmp_path, dataset, measured=100_000)
    wait_for_steps(proc, 12)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "SIGTERM" in err
    assert not trace.exists()
    kept = incomplete_path(trace)
    assert kept.exists()
    with pytest.raises(TraceFormatError, match="incomplete"):
        open_trace(kept).close()
    with open_trace(kept, allow_incomplete=True) as t:
        assert t.attrs["complete"] is False
        assert "SIGTERM" in t.attrs["incomplete_reason"]
        app = t.table("events/app")
        assert (app["phase"].astype(str) == "step").sum() >= 1
        assert len(t.table("samples/sched")) > 0
    with pytest.raises(TraceFormatError):
        summarize_trace(kept)


def test_sigkill_leaves_nothing_that_passes_as_complete(tmp_path: Path, dataset: Path) -> None:
    proc, trace = start_run(tmp_path, dataset, measured=100_000)
    wait_for_steps(proc, 8)
    proc.kill()
    proc.communicate(timeout=60)
    # Orphaned loader workers notice their parent is gone and exit on their own.
    assert not trace.exists()
    for leftover in trace.parent.iterdir():
        if leftover.suffix == ".h5" or leftover.name.endswith(".partial"):
            with pytest.raises(TraceFormatError):
                open_trace(leftover).close()


@pytest.fixture(scope="module")
def good_trace(tmp_path_factory: pytest.TempPathFactory, dataset: Path) -> Path:
    out = tmp_path_factory.mktemp("good") / "trace.h5"
    launch(spec(3), trace_path=out, dataset_dir=dataset)
    return out


def test_summarize_rejects_a_truncated_trace_naming_the_file(
    good_trace: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "truncated.h5"
    data = good_trace.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match=re.escape("truncated.h5")):
        summarize_trace(bad)


def test_summarize_rejects_flipped_bytes_naming_the_file(good_trace: Path, tmp_path: Path) -> None:
    import h5py

    bad = tmp_path / "flipped.h5"
    shutil.copy(good_trace, bad)
    with h5py.File(bad, "r") as f:
        ds = f["samples/sched/run_ns"]
        offset = ds.id.get_chunk_info(0).byte_offset
        size = ds.id.get_chunk_info(0).size
    with bad.open("r+b") as fh:
        fh.seek(offset + size // 2)
        chunk = bytearray(fh.read(8))
        fh.seek(offset + size // 2)
        fh.write(bytes(b ^ 0xFF for b in chunk))
    with pytest.raises(TraceFormatError, match=re.escape("flipped.h5")):
        summarize_trace(bad)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_full_disk_while_writing_gives_a_clear_error_and_spares_earlier_traces(
    tmp_path: Path, dataset: Path, good_trace: Path
) -> None:
    mnt = tmp_path / "small tmpfs"
    mnt.mkdir()
    try:
        size_k = good_trace.stat().st_size // 1024 + 512
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_k}k", "tmpfs", str(mnt)], check=True
        )
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        earlier = mnt / "earlier" / "trace.h5"
        earlier.parent.mkdir()
        shutil.copy(good_trace, earlier)
        before = earlier.read_bytes()
        filler = mnt / "filler"
        free = shutil.disk_usage(mnt).free
        filler.write_bytes(b"\0" * max(0, free - 16 * 1024))
        with pytest.raises((OSError, TraceFormatError)) as info:
            launch(spec(3), trace_path=mnt / "new" / "trace.h5", dataset_dir=dataset)
        message = str(info.value)
        assert "No space" in message or "space" in message.lower() or "write" in message.lower()
        assert earlier.read_bytes() == before
        with open_trace(earlier) as t:
            t.verify()
        assert not (mnt / "new" / "trace.h5").exists()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
