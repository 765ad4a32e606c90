"""Issue 37, classes 1 and 2: every command's outputs are written as one unit
(``codl.outputs``), never over an input or a device, and never half.

Each test plants one fault: a device node, a pipe or the input itself as the output, a kill
(SIGKILL, SIGTERM) at a chosen write or rename, a full tmpfs, two writers of one output; then
checks that nothing valid-looking is left and nothing that was there is lost.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from codl.cli import main
from codl.cli.advise import main as advise_main
from codl.errors import CodlError
from codl.files import exclusive_lock
from codl.outputs import UNIT_SUFFIX, manifest_of, verify_member, verify_unit
from codl.paths import RunFiles
from codl.steps.analysis import compare_to, summarize_to

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "traces"
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src"), "CODL_LOG_LEVEL": "WARNING"}
# Generous: the machine these run on is shared (2 cores, other test runs beside).
TIMEOUT = 300


def unpack(name: str, to: Path) -> Path:
    to.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(GOLDEN / f"{name}.h5.gz", "rb") as src, to.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return to


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return unpack("r1_data", tmp_path / "in" / "trace.h5")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): digest(p) for p in sorted(root.rglob("*")) if p.is_file()}


def whole_units(directory: Path) -> list[Path]:
    """The units in ``directory`` that read as finished (their manifest verifies)."""
    out = []
    for m in sorted(directory.glob(f"*{UNIT_SUFFIX}")):
        try:
            verify_unit(m)
        except CodlError:
            continue
        out.append(m)
    return out


def assert_nothing_valid_looking(directory: Path) -> None:
    """Every table a reader accepts (``verify_member``) is a member of a whole unit; the rest
    it refuses. Tables beside no manifest at all would be read as written before units."""
    listed: set[str] = set()
    for m in whole_units(directory):
        listed |= set(json.loads(m.read_text())["members"])
    for table in directory.glob("*.parquet"):
        assert manifest_of(table) is not None, f"{table.name}: beside no manifest"
        try:
            verify_member(table)
        except CodlError:
            continue
        assert table.name in listed, f"{table.name}: accepted outside a whole unit"


def codl(*args: str, plant: str = "") -> subprocess.CompletedProcess[str]:
    """``codl ARGS`` in a fresh process, with ``plant`` (Python) run first to set a fault."""
    call = f"from codl.cli import main\nraise SystemExit(main({list(args)!r}))"
    code = f"{textwrap.dedent(plant)}\n{call}"
    return subprocess.run(
        [sys.executable, "-c", code],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


# --------------------------------------------------------------------------------------------
# Class 1: outputs that are not regular files, or that are inputs


def test_export_to_dev_null_streams_and_leaves_the_device_alone(trace: Path) -> None:
    before = os.stat("/dev/null")
    leftovers = set(os.listdir("/dev"))
    assert main(["export", str(trace), "-o", "/dev/null"]) == 0
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert set(os.listdir("/dev")) - leftovers == set()


def test_export_to_dev_stdout_into_a_pipe_writes_the_json_there(trace: Path) -> None:
    done = codl("export", str(trace), "-o", "/dev/stdout")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # the JSON alone: no path line after it
    assert doc["traceEvents"]
    assert os.path.islink("/dev/stdout") or not Path("/dev/stdout").is_file()


def test_export_to_a_fifo_streams_into_it(trace: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    assert main(["export", str(trace), "-o", str(fifo)]) == 0
    reader.join(TIMEOUT)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert json.loads(got[0])["traceEvents"]


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_export_refuses_a_block_device(trace: Path, tmp_path: Path) -> None:
    dev = tmp_path / "disk"
    os.mknod(dev, stat.S_IFBLK | 0o600, os.makedev(7, 250))
    assert main(["export", str(trace), "-o", str(dev)]) == 2
    assert stat.S_ISBLK(os.stat(dev).st_mode)


def test_export_of_a_partial_named_trace_keeps_it(trace: Path, tmp_path: Path) -> None:
    # The old temporary name of output X was X.partial: the input itself here.
    named = trace.rename(trace.with_name("x.json.partial"))
    before = digest(named)
    assert main(["export", str(named), "-o", str(named.with_name("x.json"))]) == 0
    assert digest(named) == before
    assert json.loads(named.with_name("x.json").read_text())["traceEvents"]


def test_export_through_a_symlink_replaces_its_target_not_the_link(
    trace: Path, tmp_path: Path
) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert main(["export", str(trace), "-o", str(link)]) == 0
    assert link.is_symlink() and json.loads(target.read_text())["traceEvents"]


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A results directory as advise reads it; the contents never matter: refused before."""
    root = tmp_path / "results"
    (root / "tables").mkdir(parents=True)
    (root / "tables" / "runs.csv").write_text("run_id\nr\n")
    (root / "tables" / "steps.csv.gz").write_bytes(gzip.compress(b"run_id\nr\n"))
    (root / "config.yaml").write_text("experiments: []\n")
    return root


@pytest.mark.parametrize(
    "argv",
    [
        ["--out", "{r}/tables/runs.csv"],
        ["--out", "{r}/config.yaml"],
        ["--cross-validate", "{r}/tables/steps.csv.gz"],
        ["--cross-validate", "{r}/tables/runs.csv"],
        ["--out", "{r}/v.yaml", "--cross-validate", "{r}/v.yaml"],
        ["--out", "{r}/tables"],
    ],
)
def test_advise_refuses_outputs_that_are_its_inputs(
    results: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(results)
    assert advise_main([str(results), *(a.format(r=results) for a in argv)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and argv[-2] in err, err
    assert tree(results) == before


# --------------------------------------------------------------------------------------------
# Class 2: a command's outputs appear together or not at all


def test_summarize_writes_one_unit_that_compare_checks(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["summarize", str(trace), "--out-dir", str(out)]) == 0
    files = RunFiles(out)
    doc = verify_unit(files.summarize_unit)
    assert set(doc["members"]) == {p.name for p in files.tables().values()}
    assert doc["run_id"] and not list(out.glob(".codl-unit.*"))
    # A member changed after the fact (or by another writer) is refused by the reader.
    df = pd.read_parquet(files.steps)
    df.iloc[:1].to_parquet(files.steps, index=False)
    with pytest.raises(CodlError, match=r"steps\.parquet: missing or not the file"):
        compare_to(
            summaries=[files.summary],
            steps=[files.steps],
            attributions=[files.attribution],
            parts=[files.parts],
            **{k: tmp_path / f"{k}.csv" for k in ("runs_table", "steps_table")},
            comparison_table=tmp_path / "c.csv",
            attribution_table=tmp_path / "a.csv",
            decomposition_table=tmp_path / "d.csv",
        )


# A fault in the writing phase: the Nth table written kills the process.
KILL_AT_WRITE = """
import os, signal
import pandas as pd
real = pd.DataFrame.to_parquet
n = [0]
def planted(self, *a, **k):
    n[0] += 1
    if n[0] == {at}:
        os.kill(os.getpid(), signal.{sig})
    return real(self, *a, **k)
pd.DataFrame.to_parquet = planted
"""
# A fault in the commit: the Nth rename into the output directory kills the process.
KILL_AT_RENAME = """
import os, signal
real = os.replace
n = [0]
def planted(src, dst, *a, **k):
    out = real(src, dst, *a, **k)
    if str(dst).endswith((".parquet", ".unit.json")):
        n[0] += 1
        if n[0] == {at}:
            os.kill(os.getpid(), signal.{sig})
    return out
os.replace = planted
"""


@pytest.fixture
def old_unit(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """An out-dir holding a whole unit of another run, to be replaced (or kept)."""
    out = tmp_path / "out"
    other = unpack("r1_compute", tmp_path / "other" / "trace.h5")
    assert main(["summarize", str(other), "--out-dir", str(out)]) == 0
    yield out, tree(out)


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_kill_while_writing_keeps_the_old_unit(
    trace: Path, old_unit: tuple[Path, dict[str, str]], sig: str
) -> None:
    out, before = old_unit
    done = codl(
        "summarize", str(trace), "--out-dir", str(out), plant=KILL_AT_WRITE.format(at=3, sig=sig)
    )
    assert done.returncode == -getattr(signal, sig), done.stderr
    # Hidden: the killed writer's temporary directory and lock files (flock(2) died with it).
    after = {k: v for k, v in tree(out).items() if not k.startswith(".")}
    assert after == before  # nothing lost, nothing new at a final name
    assert_nothing_valid_looking(out)
    # The next summarize clears the killed writer's temporary directory.
    assert main(["summarize", str(trace), "--out-dir", str(out)]) == 0
    assert not list(out.glob(".codl-unit.*")) and whole_units(out)


def test_a_sigkill_between_renames_leaves_a_unit_that_does_not_verify(
    trace: Path, old_unit: tuple[Path, dict[str, str]]
) -> None:
    out, _ = old_unit
    # Rename 1 is the manifest, 2 and 3 two tables: a mixed set of two runs on disk.
    done = codl(
        "summarize",
        str(trace),
        "--out-dir",
        str(out),
        plant=KILL_AT_RENAME.format(at=3, sig="SIGKILL"),
    )
    assert done.returncode == -signal.SIGKILL
    assert whole_units(out) == []
    with pytest.raises(CodlError, match="missing or not the file"):
        verify_unit(RunFiles(out).summarize_unit)
    assert_nothing_valid_looking(out)


def test_a_sigterm_between_renames_waits_for_the_last_one(
    trace: Path, old_unit: tuple[Path, dict[str, str]]
) -> None:
    out, _ = old_unit
    done = codl(
        "summarize",
        str(trace),
        "--out-dir",
        str(out),
        plant=KILL_AT_RENAME.format(at=2, sig="SIGTERM"),
    )
    assert done.returncode == -signal.SIGTERM
    assert whole_units(out) == [RunFiles(out).summarize_unit]  # the new unit, whole


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_full_disk_keeps_the_old_unit_and_leaves_no_temporary(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)]
    if subprocess.run(mount, check=False).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        out = mnt / "out"
        assert main(["summarize", str(trace), "--out-dir", str(out)]) == 0
        before = tree(out)
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:  # fill the disk to the last byte
            with pytest.raises(OSError):
                while os.write(fd, b"\0" * 4096):
                    pass
        finally:
            os.close(fd)
        capsys.readouterr()
        other = unpack("r1_compute", tmp_path / "other" / "trace.h5")
        assert main(["summarize", str(other), "--out-dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert "No space left on device" in err and "Traceback" not in err
        assert tree(out) == before and whole_units(out)
        assert not list(out.glob(".codl-unit.*"))
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_held_output_is_refused_at_once(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    out.write_text("kept")
    with exclusive_lock(out, "write"):  # as another codl process writing it would
        assert main(["export", str(trace), "-o", str(out)]) == 2
    assert out.read_text() == "kept"


def test_two_exports_to_one_output_never_share_a_file(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "codl.cli", "export", str(trace), "-o", str(out)],
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [(p.wait(TIMEOUT), p.stderr.read() if p.stderr else "") for p in procs]
    assert all(rc == 0 or (rc == 2 and "another writer" in err) for rc, err in results), results
    assert any(rc == 0 for rc, _ in results)
    assert json.loads(out.read_text())["traceEvents"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "t.json"]


def test_a_second_summarize_replaces_the_whole_unit(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    files = RunFiles(out)
    assert main(["summarize", str(trace), "--out-dir", str(out)]) == 0
    # Fewer tables (the figure tables left out): none of the first unit's may stay behind.
    other = unpack("r1_compute", tmp_path / "other" / "trace.h5")
    tables = {k: files.tables()[k] for k in ("steps", "summary", "attribution", "parts")}
    summarize_to(other, **tables, manifest=files.summarize_unit)
    doc = verify_unit(files.summarize_unit)
    assert set(doc["members"]) == {p.name for p in tables.values()}
    assert not files.api_calls.exists() and not files.timeline.exists()
    assert set(pd.read_parquet(files.steps)["run_id"]) == {doc["run_id"]}


# compare: the five merged tables as one unit, which figures and advise check


@pytest.fixture
def summarized(tmp_path: Path) -> dict[str, list[Path]]:
    """compare_to's per-run inputs: the summarize units of two golden runs."""
    inputs: dict[str, list[Path]] = {"summaries": [], "steps": [], "attributions": [], "parts": []}
    for name in ("r1_data", "r1_compute"):
        trace = unpack(name, tmp_path / "runs" / name / "trace.h5")
        files = RunFiles(trace.parent)
        assert main(["summarize", str(trace), "--out-dir", str(trace.parent)]) == 0
        for key, path in zip(
            inputs, (files.summary, files.steps, files.attribution, files.parts), strict=True
        ):
            inputs[key].append(path)
    return inputs


def merged_tables(results: Path) -> dict[str, Path]:
    from codl.paths import ResultPaths

    paths = ResultPaths(results.parent)
    assert paths.results == results
    return {
        "runs_table": paths.runs_table,
        "steps_table": paths.steps_table,
        "comparison_table": paths.comparison_table,
        "attribution_table": paths.attribution_table,
        "decomposition_table": paths.decomposition_table,
    }


def compare_in_process(
    inputs: dict[str, list[Path]], results: Path, *, plant: str = ""
) -> subprocess.CompletedProcess[str]:
    """compare_to in a fresh process, with ``plant`` (Python) run first to set a fault."""
    kw = {k: [str(p) for p in v] for k, v in inputs.items()}
    kw |= {k: str(v) for k, v in merged_tables(results).items()}
    call = (
        "from pathlib import Path\nfrom codl.steps.analysis import compare_to\n"
        f"kw = {kw!r}\n"
        "compare_to(**{k: [Path(p) for p in v] if isinstance(v, list) else Path(v) "
        "for k, v in kw.items()})\n"
    )
    return subprocess.run(
        [sys.executable, "-c", f"{textwrap.dedent(plant)}\n{call}"],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_compare_writes_one_unit_that_figures_and_advise_check(
    summarized: dict[str, list[Path]], tmp_path: Path
) -> None:
    from codl.paths import ResultPaths
    from codl.steps.advisor import fit_results
    from codl.steps.analysis import merged_inputs

    results = tmp_path / "results"
    tables = merged_tables(results)
    compare_to(**summarized, **tables)  # type: ignore[arg-type]
    manifest = ResultPaths(tmp_path).compare_unit
    doc = verify_unit(manifest)
    assert set(doc["members"]) == {p.name for p in tables.values()}
    assert not list(manifest.parent.glob(".codl-unit.*"))
    figure_tables = {k: v for k, v in tables.items() if k != "attribution_table"}
    assert len(merged_inputs(**figure_tables).runs) == 2
    # A member changed after the fact (or by another writer) is refused by both readers.
    runs = tables["runs_table"]
    runs.write_text(runs.read_text() + runs.read_text().splitlines()[-1] + "\n")
    with pytest.raises(CodlError, match=r"runs\.csv: missing or not the file"):
        merged_inputs(**figure_tables)
    with pytest.raises(CodlError, match=r"runs\.csv: missing or not the file"):
        fit_results(results, fit_cores=2)


def test_compare_refuses_to_write_over_its_inputs(
    summarized: dict[str, list[Path]], tmp_path: Path
) -> None:
    before = tree(tmp_path / "runs")
    tables = merged_tables(tmp_path / "results")
    tables["comparison_table"] = summarized["summaries"][0]
    with pytest.raises(CodlError, match=r"summary\.parquet"):
        compare_to(**summarized, **tables)  # type: ignore[arg-type]
    assert tree(tmp_path / "runs") == before
    assert not (tmp_path / "results" / "tables" / "runs.csv").exists()


KILL_AT_CSV = """
import os, signal
import pandas as pd
real = pd.DataFrame.to_csv
n = [0]
def planted(self, *a, **k):
    n[0] += 1
    if n[0] == {at}:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, *a, **k)
pd.DataFrame.to_csv = planted
"""
KILL_AT_CSV_RENAME = KILL_AT_RENAME.replace(
    '(".parquet", ".unit.json")', '(".csv", ".gz", ".json")'
)


@pytest.mark.parametrize(
    ("label", "plant"),
    [
        ("killed at the third table's write", KILL_AT_CSV.format(at=3)),
        (
            "killed after the manifest and two tables were renamed",
            KILL_AT_CSV_RENAME.format(at=3, sig="SIGKILL"),
        ),
    ],
)
def test_a_killed_compare_leaves_nothing_that_reads_as_its_tables(
    summarized: dict[str, list[Path]], tmp_path: Path, label: str, plant: str
) -> None:
    from codl.paths import ResultPaths
    from codl.steps.analysis import merged_inputs

    results = tmp_path / "results"
    tables = merged_tables(results)
    # An old unit of the first run alone, to be replaced.
    compare_to(**{k: v[:1] for k, v in summarized.items()}, **tables)  # type: ignore[arg-type]
    before = tree(results)
    inputs_before = tree(tmp_path / "runs")
    done = compare_in_process(summarized, results, plant=plant)
    assert done.returncode == -signal.SIGKILL, (label, done.stderr)
    assert tree(tmp_path / "runs") == inputs_before, label  # nothing lost
    figure_tables = {k: v for k, v in tables.items() if k != "attribution_table"}
    if "write" in label:
        # Nothing renamed: the old unit, whole, and only it.
        visible = {k: v for k, v in tree(results).items() if "/." not in f"/{k}"}
        assert visible == before, label
        assert len(merged_inputs(**figure_tables).runs) == 1, label
    else:
        # A set that mixes two writes: its manifest gives it away.
        with pytest.raises(CodlError, match="missing or not the file"):
            verify_unit(ResultPaths(tmp_path).compare_unit)
        with pytest.raises(CodlError, match="missing or not the file"):
            merged_inputs(**figure_tables)
    # The next compare replaces it whole and clears the killed writer's temporary directory.
    compare_to(**summarized, **tables)  # type: ignore[arg-type]
    assert len(merged_inputs(**figure_tables).runs) == 2
    assert not list((results / "tables").glob(".codl-unit.*"))


# --------------------------------------------------------------------------------------------
# Class 5: every numeric option of every subcommand, finite and in range, or exit 2

BAD_NUMBERS = ("nan", "NaN", "inf", "-inf", "-1", "1e300", "9" * 40, "text", "")


def numeric_options() -> list[tuple[str, str, list[str]]]:
    """(command, option, the rest of a command line) for every numeric option there is: any
    option whose argparse type is not text or a path must be one of codl.cli.options'."""
    import argparse

    from codl.cli import build_parser
    from codl.cli.advise import build_parser as advise_parser

    required = {
        "run": ["s.json"],
        "export": ["t.h5", "-o", "x.json"],
        "advise": ["r"],
        "plan": ["c.yaml"],
    }
    parsers = {
        name: sub
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }
    parsers["advise"] = advise_parser()
    out = []
    for command, parser in parsers.items():
        for action in parser._actions:
            kind = getattr(action.type, "__name__", "")
            if action.type in (None, str, Path) or not action.option_strings or kind == "Prefer":
                continue
            assert kind in ("number", "integer"), (command, action.option_strings, action.type)
            out.append((command, action.option_strings[-1], required[command]))
    return out


def test_numeric_options_are_all_typed() -> None:
    found = {(c, o) for c, o, _ in numeric_options()}
    assert {("run", "--cpus-per-task"), ("export", "--from"), ("advise", "--boot")} <= found
    assert len(found) == 13


@pytest.mark.parametrize(("command", "option", "rest"), numeric_options())
def test_every_numeric_option_refuses_nan_inf_negative_and_huge(
    command: str, option: str, rest: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    for value in BAD_NUMBERS:
        with pytest.raises(SystemExit) as exc:
            main([command, *rest, f"{option}={value}"])
        err = capsys.readouterr().err
        assert exc.value.code == 2, (option, value)
        assert err.count("\n") == 1 and f"argument {option}" in err, (option, value, err)
        assert err.startswith(f"codl {command}: error: "), err


@pytest.mark.parametrize(("lo", "hi"), [("2", "1"), ("1", "1")])
def test_export_refuses_a_reversed_or_empty_window(
    trace: Path, lo: str, hi: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = trace.with_name("w.json")
    assert main(["export", str(trace), "-o", str(out), "--from", lo, "--to", hi]) == 2
    assert "--to" in capsys.readouterr().err and not out.exists()


def test_export_refuses_a_window_outside_the_trace(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = trace.with_name("w.json")
    assert main(["export", str(trace), "-o", str(out), "--from", "5000", "--to", "6000"]) == 2
    assert "no event in the window" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize(
    ("table", "column", "value"),
    [
        ("runs.csv", "workers", "many"),
        ("runs.csv", "workers", "nan"),
        ("runs.csv", "batch_size", "inf"),
        ("steps.csv.gz", "step_ms", "NaN"),
        ("steps.csv.gz", "step_ms", "slow"),
        ("steps.csv.gz", "step_ms", "-inf"),
    ],
)
def test_advise_names_a_non_number_in_a_numeric_column(
    tmp_path: Path, table: str, column: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_model import planted_tables

    runs, steps = planted_tables(repeats=1, steps=10)
    frames = {"runs.csv": runs, "steps.csv.gz": steps}
    frame = frames[table]
    frame[column] = frame[column].astype(object)
    frame.loc[frame.index[3], column] = value
    (tmp_path / "tables").mkdir()
    for name, df in frames.items():
        df.to_csv(tmp_path / "tables" / name, index=False)
    assert advise_main([str(tmp_path), "--fit-cores", "8", "--boot", "0"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"{table}: column {column!r} row 5" in err, err


def test_the_window_bound_is_one_number() -> None:
    from codl.cli import options
    from codl.trace import export

    assert options.MAX_WINDOW_S == export.MAX_WINDOW_S
