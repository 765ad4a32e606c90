"""`codl advise` on bad input: every damaged table, results directory, output path and probe
config ends in one line that names the file and what was expected, exit status 2, no traceback,
and nothing written: no output appears, no file changes, no directory is left behind."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from codl import cli
from test_advise import _write_results
from test_model import planted_tables

RUNS = Path("r") / "tables" / "runs.csv"
STEPS = Path("r") / "tables" / "steps.csv.gz"
CONFIG = Path("r") / "config.yaml"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A good results directory ``r``, its probe twin ``p`` (the same tables, for
    --calibrate), and a valid probe config ``probe.yaml`` beside them."""
    root = tmp_path_factory.mktemp("good")
    runs, steps = planted_tables(repeats=1, steps=10)
    for name in ("r", "p"):
        _write_results(root / name, runs, steps, config=True)
    probe = ["--probe-out", str(root / "probe.yaml")]
    assert cli.main(["advise", str(root / "r"), "--boot", "0", *probe]) == 0
    return root


@dataclass(frozen=True)
class Case:
    """``damage`` edits the copied tree; ``args`` (``{root}`` for its path) follow RESULTS;
    the error names ``names`` (relative to the tree, or absolute) and says ``says``."""

    damage: Callable[[Path], None]
    names: str
    says: str
    args: tuple[str, ...] = ()


def _write(rel: Path | str, data: bytes) -> Callable[[Path], None]:
    return lambda root: (root / rel).write_bytes(data)


def _csv_with(rel: Path, edit: Callable[[str], str]) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        path = root / rel
        if path.suffix == ".gz":
            path.write_bytes(
                gzip.compress(edit(gzip.decompress(path.read_bytes()).decode()).encode())
            )
        else:
            path.write_text(edit(path.read_text()))

    return damage


def _blank_column(column: str) -> Callable[[str], str]:
    """The table with ``column`` emptied in every row (NaN once read)."""

    def edit(text: str) -> str:
        lines = text.splitlines()
        at = lines[0].split(",").index(column)
        out = [lines[0]]
        for line in lines[1:]:
            cells = line.split(",")
            cells[at] = ""
            out.append(",".join(cells))
        return "\n".join(out) + "\n"

    return edit


def _drop_column(column: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        lines = [line.split(",") for line in text.splitlines()]
        at = lines[0].index(column)
        return "\n".join(",".join(c[:at] + c[at + 1 :]) for c in lines) + "\n"

    return edit


def _truncate(rel: Path) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        data = (root / rel).read_bytes()
        (root / rel).write_bytes(data[: len(data) // 2 + 7])

    return damage


def _replace(rel: Path, make: Callable[[Path], None]) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        (root / rel).unlink()
        make(root / rel)

    return damage


def _nothing(root: Path) -> None:
    pass


TABLES = {
    "empty runs.csv": Case(_write(RUNS, b""), str(RUNS), "empty file, expected a CSV table"),
    "empty steps.csv.gz": Case(_write(STEPS, b""), str(STEPS), "empty file, expected a CSV"),
    "empty gzip stream": Case(_write(STEPS, gzip.compress(b"")), str(STEPS), "no header row"),
    "header only": Case(
        _csv_with(RUNS, lambda t: t.splitlines()[0] + "\n"), str(RUNS), "no rows, expected one"
    ),
    "garbled runs.csv": Case(
        _write(RUNS, b'run_id,mode\n"unclosed,\x00\xff\n'), str(RUNS), "not a CSV table"
    ),
    "runs.csv not UTF-8": Case(
        _write(RUNS, b"run_id,mo\xffde\nx,y\n"), str(RUNS), "not UTF-8 text"
    ),
    "steps not gzip": Case(_write(STEPS, b"run_id,step_ms\n"), str(STEPS), "not gzip-compressed"),
    "truncated runs.csv": Case(_truncate(RUNS), str(RUNS), "stops mid-row"),
    "truncated steps.csv.gz": Case(_truncate(STEPS), str(STEPS), "cut short or damaged"),
    "missing column of runs": Case(
        _csv_with(RUNS, _drop_column("policy")), str(RUNS), "missing column(s) ['policy']"
    ),
    "missing column of steps": Case(
        _csv_with(STEPS, _drop_column("step_ms")), str(STEPS), "missing column(s) ['step_ms']"
    ),
    "NaN run ids": Case(
        _csv_with(RUNS, _blank_column("run_id")), str(RUNS), "'run_id' row 2 (of the file) is empty"
    ),
    "NaN policies": Case(
        _csv_with(RUNS, _blank_column("policy")), str(RUNS), "'policy' row 2 (of the file) is empty"
    ),
    "NaN workers": Case(
        _csv_with(RUNS, _blank_column("workers")), str(RUNS), "is empty, expected a finite number"
    ),
    "NaN step times": Case(
        _csv_with(STEPS, _blank_column("step_ms")), str(STEPS), "is empty, expected a finite"
    ),
    "unknown policy": Case(
        _csv_with(RUNS, lambda t: t.replace(",none,", ",nnoe,", 1)), str(RUNS), "expected one of"
    ),
    "runs.csv a directory": Case(
        _replace(RUNS, lambda p: p.mkdir()), str(RUNS), "not a regular file, expected a CSV"
    ),
    "no tables": Case(
        lambda root: shutil.rmtree(root / "r" / "tables"), str(RUNS), "missing table"
    ),
    "no results directory": Case(
        lambda root: shutil.rmtree(root / "r"), str(RUNS), "r does not exist; expected a results"
    ),
    "results is a file": Case(
        lambda root: (shutil.rmtree(root / "r"), (root / "r").write_text("x\n")),
        "r",
        "not a directory, expected a results directory",
    ),
    "garbled config.yaml": Case(
        _write(CONFIG, b"defaults: [unclosed\n"), str(CONFIG), "YAML error"
    ),
    "config.yaml not UTF-8": Case(_write(CONFIG, b"\xff\xfe\x00"), str(CONFIG), "not UTF-8"),
    "config.yaml slurm a list": Case(
        _write(CONFIG, b"slurm: [1, 2]\n"), str(CONFIG), "slurm: got a list, expected a mapping"
    ),
}
OUTPUTS = {
    "--probe-out over runs.csv": Case(
        _nothing, str(RUNS), "is the input", ("--probe-out", f"{{root}}/{RUNS}")
    ),
    "--probe-out over config.yaml": Case(
        _nothing, str(CONFIG), "is the input", ("--probe-out", f"{{root}}/{CONFIG}")
    ),
    "--probe-out over the probe config": Case(
        _nothing,
        "probe.yaml",
        "is the input",
        (
            "--calibrate",
            "{root}/p",
            "--probe-config",
            "{root}/probe.yaml",
            "--probe-out",
            "{root}/probe.yaml",
        ),
    ),
    "--probe-out a directory": Case(
        _nothing,
        "r",
        "is a directory, expected the path of a regular file",
        ("--probe-out", "{root}/r"),
    ),
    "--probe-out /dev/null": Case(
        _nothing, "/dev/null", "is a character device, expected", ("--probe-out", "/dev/null")
    ),
    "--out /dev/null": Case(_nothing, "/dev/null", "character device", ("--out", "/dev/null")),
    "--text /dev/null": Case(_nothing, "/dev/null", "character device", ("--text", "/dev/null")),
}
PROBES = {
    "missing probe config": Case(
        _nothing,
        "nope.yaml",
        "no such file, expected the probe config",
        ("--probe-config", "{root}/nope.yaml"),
    ),
    "garbled probe config": Case(
        _write("probe.yaml", b"experiments: [unclosed\n"), "probe.yaml", "YAML error"
    ),
    "probe config not UTF-8": Case(_write("probe.yaml", b"\xff\xfe"), "probe.yaml", "not UTF-8"),
    "empty probe config": Case(_write("probe.yaml", b""), "probe.yaml", "file is empty"),
    "probe config a list": Case(_write("probe.yaml", b"- a\n"), "probe.yaml", "got a list"),
    "probe config of unknown keys": Case(
        _write("probe.yaml", b"experiments: []\nwhat: 1\n"), "probe.yaml", "expected the probe"
    ),
    "probe config a directory": Case(
        lambda root: ((root / "probe.yaml").unlink(), (root / "probe.yaml").mkdir()),
        "probe.yaml",
        "not a regular file, expected the probe config",
    ),
    "missing probe results": Case(
        lambda root: shutil.rmtree(root / "p"), "p/tables/runs.csv", "missing table"
    ),
    "empty probe runs.csv": Case(
        _write("p/tables/runs.csv", b""), "p/tables/runs.csv", "empty file, expected a CSV"
    ),
    "garbled probe config.yaml": Case(
        _write("p/config.yaml", b"slurm: [unclosed\n"),
        "p/config.yaml",
        "YAML error",
        ("--calibrate", "{root}/p"),
    ),
}


def _tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` and its content's hash (directories: "dir")."""
    return {
        str(p.relative_to(root)): "dir"
        if p.is_dir()
        else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


def _run(root: Path, case: Case, capsys: pytest.CaptureFixture[str]) -> str:
    extra = [a.replace("{root}", str(root)) for a in case.args]
    if "--probe-config" in extra and "--calibrate" not in extra:
        extra = ["--calibrate", str(root / "p"), *extra]
    # Outputs in a directory that does not exist yet: a refused command must not leave it.
    outs = ["--out", str(root / "new" / "verify.yaml"), "--text", str(root / "new" / "a.txt")]
    outs = [] if "--out" in extra or "--text" in extra else outs
    before = _tree(root)
    capsys.readouterr()
    rc = cli.main(["advise", str(root / "r"), "--boot", "0", *outs, *extra])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert _tree(root) == before  # nothing created, changed or left behind
    assert not (root / "new").exists()
    assert err.startswith("codl advise: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


def _check(root: Path, case: Case, capsys: pytest.CaptureFixture[str]) -> None:
    case.damage(root)
    err = _run(root, case, capsys)
    named = case.names if case.names.startswith("/") else str(root / case.names)
    assert named in err, err
    assert case.says in err, err


@pytest.fixture
def root(template: Path, tmp_path: Path) -> Path:
    tree = tmp_path / "tree with space"
    shutil.copytree(template, tree)
    return tree


@pytest.mark.parametrize("case", TABLES.values(), ids=TABLES.keys())
def test_a_damaged_results_directory_fails_in_one_line(
    root: Path, case: Case, capsys: pytest.CaptureFixture[str]
) -> None:
    _check(root, case, capsys)


@pytest.mark.parametrize("case", OUTPUTS.values(), ids=OUTPUTS.keys())
def test_an_output_over_an_input_or_a_non_file_is_refused(
    root: Path, case: Case, capsys: pytest.CaptureFixture[str]
) -> None:
    _check(root, case, capsys)


@pytest.mark.parametrize("case", PROBES.values(), ids=PROBES.keys())
def test_a_missing_or_garbled_probe_fails_in_one_line(
    root: Path, case: Case, capsys: pytest.CaptureFixture[str]
) -> None:
    if not case.args:
        case = Case(
            case.damage,
            case.names,
            case.says,
            ("--calibrate", "{root}/p", "--probe-config", "{root}/probe.yaml"),
        )
    _check(root, case, capsys)


def test_the_good_tree_advises(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The template the cases damage is good: undamaged, the same command succeeds.
    argv = ["advise", str(root / "r"), "--boot", "0", "--out", str(root / "new" / "v.yaml")]
    assert cli.main(argv) == 0
    assert (root / "new" / "v.yaml").is_file()
    probe = ["--calibrate", str(root / "p"), "--probe-config", str(root / "probe.yaml")]
    # The probe's runs are the fit's own here, not the probe config's: refused, one line.
    assert cli.main(["advise", str(root / "r"), "--boot", "0", *probe]) == 2
    assert "not in its runs.csv" in capsys.readouterr().err


def test_the_command_a_user_types_prints_no_traceback(root: Path) -> None:
    # In a process of its own, as typed: stderr holds the one line, nothing else.
    (root / RUNS).write_bytes(b"")
    done = subprocess.run(
        [sys.executable, "-m", "codl.cli", "advise", str(root / "r"), "--boot", "0"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        f"codl advise: error: {root / RUNS}: empty file, expected a CSV table with a header row "
        "and one row per run\n"
    )
