"""A full disk during any command's write: one clear line, nothing half-written, nothing lost.

Every output directory here is on a tiny tmpfs filled to the last page, so the first write of
any output fails with ENOSPC. Each command must then exit with status 2 and one line that names
the file and says the disk is full (no traceback), leave no file at the output's name (or the
one there before, as it was), no temporary file or directory, and its inputs as they were.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from codl.errors import CodlError
from codl.paths import RunFiles
from codl.steps.analysis import compare_to, figures_to, summarize_to
from shellenv import codl

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "tests" / "golden" / "traces"
FIT_RESULTS = REPO / "results" / "fit-h200-light"
FULL = ("no space left", "disk is full")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted after the test; skipped where mounting is not permitted."""
    mnt = tmp_path / "small fs"
    mnt.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
            check=True,
            capture_output=True,
        )
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def fill(mnt: Path) -> None:
    """Fill ``mnt`` to its last page (a file beside the output directories)."""
    fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


def snapshot(*paths: Path) -> dict[str, str]:
    """Every file under ``paths`` with its sha256."""
    out: dict[str, str] = {}
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for p in files:
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def unpack(name: str, to: Path) -> Path:
    to.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(TRACES / f"{name}.h5.gz", "rb") as src, to.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return to


def assert_one_line_full_disk(proc: subprocess.CompletedProcess[str], names: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ": error: " in ln]
    assert len(errors) == 1, proc.stderr
    line = errors[0]
    assert names in line, line
    assert any(w in line.lower() for w in FULL), line


def assert_no_leftovers(out_dir: Path, allowed: set[str]) -> None:
    left = {p.name for p in out_dir.iterdir()} - allowed
    assert not left, left


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack("r1_combined", tmp_path_factory.mktemp("trace") / "trace.h5")


def test_summarize_on_a_full_disk_keeps_the_earlier_tables(
    small_fs: Path, trace: Path, tmp_path: Path
) -> None:
    out = small_fs / "out"
    out.mkdir()
    first = codl("summarize", str(trace), "--out-dir", str(out))
    assert first.returncode == 0, first.stderr
    earlier = snapshot(out)
    assert earlier
    inputs = snapshot(trace)
    fill(small_fs)
    proc = codl("summarize", str(trace), "--out-dir", str(out))
    assert_one_line_full_disk(proc, str(out))
    assert snapshot(out) == earlier
    assert_no_leftovers(out, {Path(p).name for p in earlier})
    assert snapshot(trace) == inputs


def test_summarize_on_a_full_disk_writes_nothing(small_fs: Path, trace: Path) -> None:
    out = small_fs / "out"
    out.mkdir()
    inputs = snapshot(trace)
    fill(small_fs)
    proc = codl("summarize", str(trace), "--out-dir", str(out))
    assert_one_line_full_disk(proc, str(out))
    assert_no_leftovers(out, set())
    assert snapshot(trace) == inputs


@pytest.mark.parametrize("fmt", ["chrome-json", "perfetto-proto"])
@pytest.mark.parametrize("earlier", [False, True], ids=["new", "over-an-earlier-export"])
def test_export_on_a_full_disk(small_fs: Path, trace: Path, earlier: bool, fmt: str) -> None:
    out = small_fs / "out" / "trace.json"
    out.parent.mkdir()
    if earlier:
        out.write_text('{"traceEvents": []}\n')
    before = snapshot(out.parent)
    inputs = snapshot(trace)
    fill(small_fs)
    proc = codl("export", str(trace), "-o", str(out), "--format", fmt)
    assert_one_line_full_disk(proc, str(out))
    assert snapshot(out.parent) == before
    assert_no_leftovers(out.parent, {out.name} if earlier else set())
    assert snapshot(trace) == inputs


def test_export_to_dev_full_names_it(trace: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    proc = codl("export", str(trace), "-o", "/dev/full")
    assert_one_line_full_disk(proc, "/dev/full")


def test_convert_on_a_full_disk(small_fs: Path, trace: Path) -> None:
    out = small_fs / "out" / "converted.h5"
    out.parent.mkdir()
    inputs = snapshot(trace)
    fill(small_fs)
    proc = codl("convert", str(trace), "-o", str(out))
    assert_one_line_full_disk(proc, str(out))
    assert_no_leftovers(out.parent, set())
    assert snapshot(trace) == inputs


@pytest.mark.parametrize("earlier", [False, True], ids=["new", "over-an-earlier-config"])
def test_advise_on_a_full_disk(small_fs: Path, tmp_path: Path, earlier: bool) -> None:
    results = tmp_path / "results"
    shutil.copytree(FIT_RESULTS, results)
    out = small_fs / "out" / "verify.yaml"
    out.parent.mkdir()
    if earlier:
        out.write_text("# an earlier verification config\n")
    before = snapshot(out.parent)
    inputs = snapshot(results)
    fill(small_fs)
    proc = codl("advise", str(results), "--out", str(out))
    assert_one_line_full_disk(proc, str(out))
    assert snapshot(out.parent) == before
    assert_no_leftovers(out.parent, {out.name} if earlier else set())
    assert snapshot(results) == inputs


@pytest.fixture(scope="module")
def summarized(tmp_path_factory: pytest.TempPathFactory) -> list[RunFiles]:
    """Two golden runs (a combined run and its compute twin) summarized on a roomy disk."""
    root = tmp_path_factory.mktemp("runs")
    files = []
    for name in ("r1_compute", "r1_combined"):
        f = RunFiles(root / name)
        summarize_to(unpack(name, f.trace), **f.tables())
        f.trace.unlink()
        files.append(f)
    return files


def merged_names(tables: Path) -> dict[str, Path]:
    return {
        "runs_table": tables / "runs.csv",
        "steps_table": tables / "steps.csv",
        "comparison_table": tables / "comparison.csv",
        "decomposition_table": tables / "decomposition.csv",
    }


def compare(files: list[RunFiles], tables: Path) -> None:
    compare_to(
        summaries=[f.summary for f in files],
        steps=[f.steps for f in files],
        attributions=[f.attribution for f in files],
        parts=[f.parts for f in files],
        attribution_table=tables / "attribution.csv",
        **merged_names(tables),
    )


def test_compare_on_a_full_disk(small_fs: Path, summarized: list[RunFiles]) -> None:
    tables = small_fs / "tables"
    tables.mkdir()
    inputs = snapshot(*(f.dir for f in summarized))
    fill(small_fs)
    with pytest.raises(CodlError) as info:
        compare(summarized, tables)
    message = str(info.value)
    assert "\n" not in message and str(tables) in message
    assert any(w in message.lower() for w in FULL), message
    assert_no_leftovers(tables, set())
    assert snapshot(*(f.dir for f in summarized)) == inputs


def test_figures_on_a_full_disk(small_fs: Path, summarized: list[RunFiles], tmp_path: Path) -> None:
    tables = tmp_path / "tables"
    compare(summarized, tables)
    inputs = snapshot(tables, *(f.dir for f in summarized))
    figdir = small_fs / "figures"
    figdir.mkdir()
    fill(small_fs)
    with pytest.raises(CodlError) as info:
        figures_to(
            **merged_names(tables),
            api_calls=[f.api_calls for f in summarized],
            timelines=[f.timeline for f in summarized],
            figdir=figdir,
        )
    message = str(info.value)
    assert "\n" not in message and str(figdir) in message
    assert any(w in message.lower() for w in FULL), message
    assert_no_leftovers(figdir, set())
    assert snapshot(tables, *(f.dir for f in summarized)) == inputs
