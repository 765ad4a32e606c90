"""The `codl` command line as a user meets it: every subcommand's misuse is one clean error line
(no traceback), `--version`, a closed pipe, `plan`'s row count, the log level, the progress lines
of a run and the analysis logs, and `summarize` writing the tables the workflow's rule writes.

Deeper refusals (outputs that would destroy an input, damaged traces, plan limits) are in
test_safety.py; these are the misuses of each subcommand's arguments."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest

from codl import __version__
from codl.cli import main
from codl.config import load_plan
from codl.harness.progress import StepProgress
from codl.log import ENV
from codl.paths import RunFiles
from codl.spec import Mode, RunSpec

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "config" / "smoke.yaml"
GOLDEN_TRACE = REPO / "tests" / "golden" / "traces" / "r1_combined.h5.gz"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """A few real files a user might hand to the wrong option."""
    not_json = tmp_path / "notes.txt"
    not_json.write_text("not json {")
    data_spec = tmp_path / "data spec.json"
    data_spec.write_text(json.dumps(RunSpec().with_mode(Mode.DATA).to_dict()))
    manifest = tmp_path / "not a data set" / "MANIFEST.json"
    manifest.parent.mkdir()
    manifest.write_text("{}")
    return {"dir": tmp_path, "not_json": not_json, "data_spec": data_spec, "manifest": manifest}


def misuses(f: dict[str, Path]) -> list[tuple[list[str], str]]:
    """(argv, a fragment the error must contain) for each subcommand's bad arguments."""
    d = f["dir"]
    missing = d / "missing"
    return [
        (["run", str(missing / "spec.json")], "no such spec file"),
        (["run", str(f["not_json"])], "not valid JSON"),
        (["run", str(f["data_spec"])], "--dataset-dir"),
        (["run", str(f["data_spec"]), "--dataset-dir", str(missing)], str(missing)),
        (["run", str(f["data_spec"]), "--kineto-dir", str(f["not_json"])], "--kineto-dir"),
        (["inspect", str(missing / "t.h5")], "no such trace file"),
        (["inspect", str(f["not_json"])], "not an HDF5 file"),
        (["export", str(missing / "t.h5"), "-o", str(d / "t.json")], "no such trace file"),
        (["export", str(f["not_json"]), "-o", str(missing / "t.json")], "does not exist"),
        (["export", str(f["not_json"]), "-o", str(d)], "is a directory"),
        (["plan", str(missing / "c.yaml")], "no such config file"),
        (["plan", str(f["not_json"])], "expected a mapping"),
        (["dataset", "--spec-json", "{x", "--out", str(d / "ds")], "--spec-json"),
        (["dataset", "--spec-json", '{"files": 1}', "--out", str(d / "ds")], "dataset.files"),
        (["write-spec", "{x", "--out", str(d / "s.json")], "not valid JSON"),
        (["write-spec", '{"mode": "fast"}', "--out", str(d / "s.json")], "mode"),
        (["stage", str(f["manifest"]), "--to", str(d / "t"), "--marker", str(d / "m")], "manifest"),
        (["summarize", str(missing / "t.h5"), "--out-dir", str(d / "o")], "no such trace file"),
        (["summarize", str(f["not_json"]), "--out-dir", str(d / "o")], "not an HDF5 file"),
        (["--log-level", "info", "plan", str(missing / "c.yaml")], "no such config file"),
    ]


COMMANDS = ("run", "inspect", "export", "plan", "dataset", "write-spec", "stage", "summarize")


def _command(argv: list[str]) -> str:
    return next(a for a in argv if a in COMMANDS)


def test_every_subcommand_misuse_is_a_clean_error(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    cases = misuses(files)
    # Every subcommand but advise (its own parser, tested in test_advise.py) is covered.
    assert {_command(argv) for argv, _ in cases} == set(COMMANDS)
    for argv, fragment in cases:
        rc = main(argv)
        err = capsys.readouterr().err
        command = _command(argv)
        assert rc == 2, (argv, err)
        # Log lines (the analysis says what it reads) may come first; the error is one line
        # (ConfigError's list of problems follows it, one indented line each).
        said = [line for line in err.splitlines() if " codl." not in line[:40]]
        assert said[0].startswith(f"codl {command}: error: "), (argv, err)
        assert all(line.startswith("  - ") for line in said[1:]), (argv, err)
        assert fragment in err, (argv, err)
        assert "Traceback" not in err, (argv, err)
    # Nothing was created by a refused command.
    assert not (files["dir"] / "ds").exists() and not (files["dir"] / "o").exists()
    assert not (files["dir"] / "s.json").exists()


@pytest.mark.parametrize(
    "argv",
    [["bogus"], [], ["run"], ["export", "t.h5"], ["--log-level", "loud", "plan", "c.yaml"]],
)
def test_argument_errors_are_usage_and_one_error_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert next(line for line in err.splitlines() if "error:" in line).startswith("codl")
    assert "Traceback" not in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"codl {__version__}"


def test_a_bad_log_level_in_the_environment_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ENV, "chatty")
    assert main(["plan", str(SMOKE)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"codl plan: error: ${ENV}: got 'chatty'"), err


def test_a_reader_that_leaves_early_is_no_traceback() -> None:
    # `codl plan CONFIG | head`: the read end is closed before codl writes a line.
    proc = subprocess.Popen(
        [sys.executable, "-m", "codl.cli", "plan", str(REPO / "config" / "config.yaml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait() == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


# `compute` does not read loader workers, so factor `loader.workers` plans one `compute` run twice
# in experiment a, and experiment b plans it a third time.
SHARED_RUNS = """
defaults: {device: cpu, dataset: {name: d, samples: 64}}
experiments:
  - {name: a, factors: {mode: [compute, data], loader.workers: [1, 2]}}
  - {name: b, factors: {mode: [compute]}}
"""


def test_plan_lists_each_distinct_run_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "shared.yaml"
    config.write_text(SHARED_RUNS)
    plan = load_plan(config)
    assert len(plan.runs) == 5 and len(plan.specs) == 3
    assert main(["plan", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    # The result set is named by the file: results/shared/.
    assert lines[0] == (
        "3 distinct runs in 2 experiment(s); tables, figures and report in results/shared/"
    )
    assert len(lines) == 4
    assert main(["plan", "--result-set", str(config)]) == 0
    assert capsys.readouterr().out == "results/shared\n"
    config.write_text(f"name: paper-run\n{SHARED_RUNS}")
    assert main(["plan", "--result-set", str(config)]) == 0
    assert capsys.readouterr().out == "results/paper-run\n"
    bad_names = (("runs", "names the runs' directory"), ("a/b/c", "name: got 'a/b/c', expected"))
    for bad, why in bad_names:
        config.write_text(f"name: {bad}\n{SHARED_RUNS}")
        assert main(["plan", str(config)]) == 2
        assert why in capsys.readouterr().err
    config.write_text(SHARED_RUNS)
    assert lines[1].startswith("experiments=a,b  run_id=")
    assert main(["plan", str(config), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in rows] == list(plan.specs)
    assert [r["experiments"] for r in rows] == [["a", "b"], ["a"], ["a"]]


def test_progress_lines_come_at_the_edges_and_every_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    p = StepProgress(rank=1, world=2, total=100, warmup=5, batch=8, every_s=10.0)
    start = p._t_start
    caplog.set_level(logging.INFO, logger="codl")
    lines = {}
    # One step per second: lines at step 0, the last warm-up step (4), every 10 s, the last.
    for step in range(100):
        line = p.step_done(step, now=start + step + 1)
        if line:
            lines[step] = line
    assert list(lines) == [0, 4, 14, 24, 34, 44, 54, 64, 74, 84, 94, 99]
    assert lines[14].startswith("rank 1/2: step 15/100 (measured), 1.00 steps/s, 8.0 samples/s")
    assert "(warm-up)" in lines[4]
    assert [r.getMessage() for r in caplog.records] == list(lines.values())


def test_progress_of_a_mode_without_samples_gives_steps_only() -> None:
    p = StepProgress(rank=0, world=1, total=3, warmup=1, batch=0)
    line = p.step_done(0, now=p._t_start + 0.5)
    assert line is not None and "2.00 steps/s" in line and "samples" not in line


def test_summarize_writes_every_table_of_the_rule_and_logs_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.h5"
    with gzip.open(GOLDEN_TRACE, "rb") as src, trace.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    out = tmp_path / "out"
    assert main(["summarize", str(trace), "--out-dir", str(out)]) == 0
    captured = capsys.readouterr()
    tables = RunFiles(out).tables()
    assert set(tables) == {"steps", "summary", "attribution", "parts", "api_calls", "timeline"}
    run_id = str(pd.read_parquet(tables["summary"])["run_id"].iloc[0])
    assert run_id in captured.out
    assert f"reading {trace}" in captured.err
    for name, path in tables.items():
        # A CPU run makes no CUDA API calls: that table is written, with no rows.
        assert (len(pd.read_parquet(path)) > 0) == (name != "api_calls"), path
        assert f"wrote {path} (" in captured.err


def test_the_docs_show_real_inspect_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/outputs.md, "Looking at one run" (moved there from the README).
    page = (REPO / "docs" / "outputs.md").read_text()
    block = page.split("$ codl inspect trace.h5\n", 1)[1].split("```", 1)[0]
    trace = tmp_path / "trace.h5"
    with gzip.open(REPO / "tests" / "golden" / "traces" / "r2_combined.h5.gz", "rb") as src:
        trace.write_bytes(src.read())
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", "trace.h5"]) == 0
    assert capsys.readouterr().out == block


def test_workers_per_cpu_check_counts_the_core_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 17 workers are within the limit of 16 per CPU on a machine of 2 CPUs, not on a budget of 1.
    spec = tmp_path / "budget.json"
    spec.write_text('{"mode": "data", "loader": {"workers": 17}, "pinning": {"cpus": 1}}')
    assert main(["run", str(spec), "--trace", str(tmp_path / "t.h5")]) == 2
    assert "(1 CPUs here: at most 16)" in capsys.readouterr().err
    assert not (tmp_path / "t.h5").exists()


# --- What a newcomer meets (issue 38) ---------------------------------------------------------


@pytest.mark.parametrize("form", [["--log-level", "DEBUG"], ["--log-level=debug"]])
def test_a_global_option_before_advise_is_used(
    tmp_path: Path,
    form: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # configure() exports the level for child processes: put the environment back afterwards,
    # so that later tests' main() do not log at DEBUG.
    monkeypatch.setenv(ENV, "INFO")
    # Not a traceback: the global option is this parser's, the rest is advise's.
    assert main([*form, "advise", str(tmp_path), "--boot", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("codl advise: error: ") and "tables/runs.csv: missing table" in err
    assert "Traceback" not in err
    assert logging.getLogger("codl").level == logging.DEBUG
    with pytest.raises(SystemExit) as bad:
        main(["--log-level", "loud", "advise", str(tmp_path)])
    assert bad.value.code == 2
    assert "argument --log-level" in capsys.readouterr().err


def test_advise_reads_committed_tables_without_a_pandas_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # results/h200x2's steps table has a sparse text column (outlier_reason) that a chunked
    # read types differently per chunk: pandas' DtypeWarning reached the user.
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.DtypeWarning)
        rc = main(["advise", str(REPO / "results" / "h200x2"), "--boot", "0"])
    err = capsys.readouterr().err
    # That set has data runs at one worker count: advise says so in one line.
    assert rc == 2 and err.count("\n") == 1 and "worker count" in err, err


def test_summarize_writes_beside_the_trace_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    trace = run / "trace.h5"
    with gzip.open(GOLDEN_TRACE, "rb") as src, trace.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    assert main(["summarize", str(trace)]) == 0
    capsys.readouterr()
    assert all(p.is_file() for p in RunFiles(run).tables().values())
    # The option says where the tables go when it is left out.
    from codl.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices["summarize"]  # type: ignore[union-attr]
    assert "default: the trace's own directory" in " ".join(sub.format_help().split())


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["inspect", "{d}"], "is a directory, expected a trace file"),
        (["run", "{d}"], "is a directory, expected a run's spec file"),
        (["plan", "{d}"], "is a directory, expected a config file"),
        (["summarize", "{d}"], "is a directory, expected a trace file"),
        (["export", "{d}", "-o", "{d}/x.json"], "is a directory, expected a trace file"),
    ],
)
def test_a_directory_for_a_file_is_one_line(
    tmp_path: Path, argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([a.format(d=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and "Errno" not in err, err
    assert not (tmp_path / "x.json").exists()


def test_a_run_directory_points_at_its_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "spec.json").write_text("{}")
    assert main(["run", str(tmp_path)]) == 2
    assert f"(did you mean {tmp_path / 'spec.json'}?)" in capsys.readouterr().err


def test_a_config_with_two_problems_reports_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A broken `defaults` key used to stop the checks before the experiments were read.
    config = tmp_path / "two.yaml"
    config.write_text(
        "defaults: {device: cpu, loader: {workers: -1}, dataset: {name: d, samples: 64}}\n"
        "experiments:\n"
        "  - {name: a, factors: {mode: [compute, bogus]}}\n"
        "  - {name: a}\n"
    )
    assert main(["plan", str(config)]) == 2
    err = capsys.readouterr().err
    assert "3 problem(s)" in err, err
    assert "defaults.loader.workers: -1 is less than the minimum of 0" in err
    assert "mode: got 'bogus'" in err
    assert "experiments[1].name: duplicate experiment name 'a'" in err


@pytest.mark.parametrize(
    "codl",
    ["codl", '"$CODL_PYTHON" -m codl.cli'],
    ids=["typed", "rule"],
)
def test_the_demo_shortens_the_spec_commands_on_the_console(codl: str) -> None:
    # The spec rule's command line holds the run's whole spec; `make demo` cuts it to the
    # output path on the console (Snakemake's own log keeps it whole). The rule runs codl as
    # the module of the interpreter that runs Snakemake (codl.steps.workflow.codl_python).
    show = "print-short-specs: ; $(info $(SHORT_SPECS))"  # --eval runs before the Makefile
    sed = subprocess.run(
        [
            "make",
            "-s",
            "--no-print-directory",
            "-C",
            str(REPO),
            "--eval",
            show,
            "print-short-specs",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()[0]
    spec = json.dumps(RunSpec().to_dict())
    line = f"Shell command: {codl} write-spec '{spec}' --out results/runs/ab/spec.json > x 2>&1"
    out = subprocess.run(
        ["bash", "-c", sed],
        input=f"{line}\nrule run:\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.splitlines() == [
        f"Shell command: {codl} write-spec SPEC_JSON --out results/runs/ab/spec.json "
        "(whole in .snakemake/log/)",
        "rule run:",
    ]
    assert len(line) > 1000
