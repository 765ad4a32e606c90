"""The analysis commands keep numpy's OpenBLAS to one thread; `codl run` leaves it alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from codl.blas import BLAS_THREADS_VAR

# Prints the variable and this process's threads after numpy is loaded, as JSON.
REPORT = """
import json, os, sys
{before}
import numpy
print(json.dumps({{"var": os.environ.get({var!r}), "threads": len(os.listdir("/proc/self/task"))}}))
"""


def _report(before: str, tmp_path: Path, script: str = REPORT, **env: str) -> dict[str, object]:
    """Run ``script`` with ``before`` in a fresh process whose environment has no count of its
    own unless ``env`` gives one; its last line, as JSON."""
    clean = {k: v for k, v in os.environ.items() if k != BLAS_THREADS_VAR}
    out = subprocess.run(
        [sys.executable, "-c", script.format(before=before, var=BLAS_THREADS_VAR)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env={**clean, **env},
    )
    report: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return report


needs_proc = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="no /proc")


@needs_proc
def test_one_blas_thread_keeps_numpy_from_starting_threads(tmp_path: Path) -> None:
    plain = _report("", tmp_path)
    if plain["threads"] == 1:
        pytest.skip("numpy starts no BLAS thread here (one core, or no threaded BLAS)")
    quiet = _report("from codl.blas import one_blas_thread; one_blas_thread()", tmp_path)
    assert quiet == {"var": "1", "threads": 1}


@needs_proc
def test_a_users_own_count_is_kept_and_a_late_call_changes_nothing(tmp_path: Path) -> None:
    own = _report(
        "from codl.blas import one_blas_thread; one_blas_thread()",
        tmp_path,
        **{BLAS_THREADS_VAR: "3"},
    )
    assert own["var"] == "3"
    late = _report(
        "import numpy; from codl.blas import one_blas_thread; one_blas_thread()", tmp_path
    )
    assert late["var"] is None  # numpy already loaded: its threads already started


@needs_proc
def test_the_cli_sets_it_for_analysis_commands_and_not_for_run(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    inspect = _report(
        f"from codl.cli import main; assert main(['inspect', {str(missing)!r}]) == 2", tmp_path
    )
    assert inspect["var"] == "1"
    run = _report(
        f"from codl.cli import main; assert main(['run', {str(missing)!r}]) == 2", tmp_path
    )
    assert run["var"] is None


def test_every_workflow_script_asks_before_it_loads_numpy() -> None:
    """Each rule's script runs in a process of its own: the call must come before its first
    import of numpy, pandas or codl beyond codl.blas and codl.log (which load neither)."""
    scripts = sorted((Path(__file__).parents[1] / "workflow" / "scripts").glob("*.py"))
    assert scripts
    for script in scripts:
        lines = script.read_text().splitlines()
        call = lines.index("one_blas_thread()  # before numpy loads; see codl.blas")
        heavy = [
            i
            for i, line in enumerate(lines)
            if line.startswith(("import ", "from "))
            and ("numpy" in line or "pandas" in line or "codl" in line)
            and not line.startswith(("from codl.blas ", "from codl.log "))
        ]
        assert heavy and call < min(heavy), script.name


# The environment a shared-node job (the share rule's `codl run`) gets, as JSON.
JOB_ENV = """
import json, os
{before}
from pathlib import Path
from codl.steps.share import Job, job_env
job = Job(name="a", spec=None, dataset_dir=None, trace=Path("a.h5"))
print(json.dumps({{"here": os.environ.get({var!r}), "job": job_env(job, os.environ).get({var!r})}}))
"""


def test_a_training_run_started_by_an_analysis_process_keeps_the_users_threads(
    tmp_path: Path,
) -> None:
    """The share rule's script asks for one thread, then starts `codl run` jobs: those compute
    as `codl run` does when a user types it (torch on OpenBLAS on aarch64)."""
    ask = "from codl.blas import one_blas_thread; one_blas_thread()"
    assert _report(ask, tmp_path, JOB_ENV) == {"here": "1", "job": None}
    # A count the user set, even 1, is the user's: the job keeps it.
    assert _report(ask, tmp_path, JOB_ENV, **{BLAS_THREADS_VAR: "1"}) == {"here": "1", "job": "1"}
    assert _report(ask, tmp_path, JOB_ENV, **{BLAS_THREADS_VAR: "4"}) == {"here": "4", "job": "4"}
    assert _report("", tmp_path, JOB_ENV) == {"here": None, "job": None}
