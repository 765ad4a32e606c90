"""Output names near NAME_MAX (255 bytes): the names an output unit derives from an output's
name (its temporary directory, its lock) fit the limit too, and a name past it is refused with
one line before any work."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from codl.errors import CodlError
from codl.files import NAME_MAX, exclusive_lock, lock_path
from codl.outputs import output_unit
from shellenv import codl

TRACES = Path(__file__).resolve().parent / "golden" / "traces"
# One byte, two bytes (é) and three bytes (日) a character.
CHARS = {"ascii": "a", "utf8-2": "é", "utf8-3": "日"}


def name_of(nbytes: int, char: str, suffix: str = ".json") -> str:
    """A file name of exactly ``nbytes`` bytes in UTF-8: ``char`` repeated, ASCII padding,
    then ``suffix``."""
    width = len(char.encode())
    body = nbytes - len(suffix.encode())
    name = char * (body // width) + "x" * (body % width) + suffix
    assert len(os.fsencode(name)) == nbytes
    return name


LENGTHS = (200, 250, 255)
CASES = [pytest.param(n, c, id=f"{n}-{k}") for n in LENGTHS for k, c in CHARS.items()]


def leftovers(directory: Path, *finals: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p not in finals)


@pytest.mark.parametrize(("nbytes", "char"), CASES)
def test_a_unit_of_one_long_name_is_written_and_leaves_nothing_behind(
    tmp_path: Path, nbytes: int, char: str
) -> None:
    out = tmp_path / name_of(nbytes, char)
    for attempt in ("new", "again"):
        with output_unit({"-o": out}) as unit:
            tmp = unit.path(out)
            assert tmp != out
            # Every name the unit made on the way fits the limit.
            for p in tmp_path.iterdir():
                assert len(os.fsencode(p.name)) <= NAME_MAX, p.name
            tmp.write_text(attempt)
        assert out.read_text() == attempt
        assert leftovers(tmp_path, out) == []


@pytest.mark.parametrize(("nbytes", "char"), CASES)
def test_a_unit_with_a_long_manifest_name(tmp_path: Path, nbytes: int, char: str) -> None:
    manifest = tmp_path / name_of(nbytes, char, ".unit.json")
    members = [tmp_path / name_of(nbytes, char, f".{i}.csv") for i in range(2)]
    with output_unit(members, manifest=manifest) as unit:
        for p in tmp_path.iterdir():
            assert len(os.fsencode(p.name)) <= NAME_MAX, p.name
        for m in members:
            unit.path(m).write_text(m.name)
    assert all(m.read_text() == m.name for m in members)
    assert manifest.exists()
    assert leftovers(tmp_path, manifest, *members) == []


@pytest.mark.parametrize(("nbytes", "char"), CASES)
@pytest.mark.parametrize("purpose", ["write", "run"])
def test_lock_names_fit_and_still_exclude(
    tmp_path: Path, nbytes: int, char: str, purpose: str
) -> None:
    final = tmp_path / name_of(nbytes, char)
    lock = lock_path(final, purpose)
    assert len(os.fsencode(lock.name)) <= NAME_MAX
    assert lock.parent == final.parent and lock.name.startswith(".")
    assert lock_path(final, purpose) == lock  # the same for every writer
    other = tmp_path / name_of(nbytes, char, ".jsom")
    assert lock_path(other, purpose) != lock  # and its own for each output
    with exclusive_lock(final, purpose) as held:
        assert held == lock and lock.exists()
        with pytest.raises(CodlError, match="holds it"), exclusive_lock(final, purpose):
            pass
    assert not lock.exists()


def test_a_killed_writers_leftover_of_a_long_name_is_cleared(tmp_path: Path) -> None:
    out = tmp_path / name_of(250, "日")
    with pytest.raises(RuntimeError), output_unit({"-o": out}) as unit:
        unit.path(out).write_text("half")
        # Left as a SIGKILLed writer leaves it: renamed to a pid that is gone.
        dead = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            check=True,
        )
        left = unit.path(out).parent
        stale = left.with_name(left.name.replace(f".{os.getpid()}-", f".{dead.stdout.strip()}-"))
        shutil.copytree(left, stale)
        raise RuntimeError("killed")
    assert leftovers(tmp_path) == [stale.name]
    with output_unit({"-o": out}) as unit:
        unit.path(out).write_text("whole")
    assert out.read_text() == "whole"
    assert leftovers(tmp_path, out) == []


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    to = tmp_path_factory.mktemp("trace") / "trace.h5"
    with gzip.open(TRACES / "r1_compute.h5.gz", "rb") as src, to.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return to


@pytest.mark.parametrize("char", CHARS.values(), ids=CHARS.keys())
def test_export_to_a_250_byte_name(tmp_path: Path, trace: Path, char: str) -> None:
    out = tmp_path / "out" / name_of(250, char)
    out.parent.mkdir()
    proc = codl("export", str(trace), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0
    assert leftovers(out.parent, out) == []


def test_convert_to_a_255_byte_name(tmp_path: Path, trace: Path) -> None:
    out = tmp_path / "out" / name_of(255, "é", ".h5")
    out.parent.mkdir()
    proc = codl("convert", str(trace), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_size > 0
    assert leftovers(out.parent, out) == []


def test_a_name_past_the_limit_is_refused_in_one_line(tmp_path: Path, trace: Path) -> None:
    out = tmp_path / "out" / name_of(256, "日")
    out.parent.mkdir()
    proc = codl("export", str(trace), "-o", str(out))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "-o/--output" in lines[0] and "too long" in lines[0], lines
    assert leftovers(out.parent) == []
