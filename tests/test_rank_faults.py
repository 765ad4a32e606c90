"""A multi-rank run that fails (a rank killed, a rank raising, `codl run` stopped): one clear
error naming the rank, no process left behind, nothing that reads as complete, and nothing left
in the temporary directories the launcher and its ranks use."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from codl.datasets import generate
from codl.errors import TraceFormatError
from codl.harness.runner import write_spec_json
from codl.spec import DatasetSpec, RunSpec
from codl.trace.store import open_trace
from test_safety import run_cmd, sampling, spawned_ranks

pytestmark = pytest.mark.slow

ENDLESS = {
    "mode": "compute+comm",
    "workload": {"batch_size": 2, "image_size": 16},
    "layout": {"ranks_per_node": 2},
    "steps": {"warmup": 1, "measured": 100_000},
}


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (ranks, their loader workers, torch's helpers)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for task in Path(f"/proc/{p}/task").iterdir():
                for child in map(int, (task / "children").read_text().split()):
                    if child not in found:
                        found.add(child)
                        todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def shm_of(pids: set[int]) -> set[str]:
    """/dev/shm entries torch names after one of ``pids`` (``torch_<pid>_...``)."""
    names = set()
    with contextlib.suppress(FileNotFoundError):
        for p in Path("/dev/shm").iterdir():
            parts = p.name.split("_")
            if p.name.startswith("torch_") and parts[1:2] and parts[1].isdigit():
                names.update([p.name] if int(parts[1]) in pids else [])
    return names


class Run:
    """`codl run` of a 2-rank endless spec in its own session, with its own TMPDIR."""

    def __init__(
        self, tmp_path: Path, spec: dict[str, Any] = ENDLESS, dataset: Path | None = None
    ) -> None:
        self.spec = RunSpec.from_dict(spec)
        self.dir = tmp_path / "run"
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        write_spec_json(self.spec, self.dir / "spec.json")
        self.trace = self.dir / "trace.h5"
        extra = ["--dataset-dir", str(dataset)] if dataset else []
        self.proc = subprocess.Popen(
            run_cmd(self.dir / "spec.json", self.trace, *extra),
            env={**os.environ, "TMPDIR": str(self.tmp)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.seen: set[int] = set()

    def wait_for_steps(self) -> list[int]:
        deadline = time.monotonic() + 180
        while len(ranks := spawned_ranks(self.proc.pid)) < 2 or not all(map(sampling, ranks)):
            assert self.proc.poll() is None, self.proc.communicate()
            assert time.monotonic() < deadline, "the ranks never reached their first step"
            time.sleep(0.2)
        time.sleep(2)
        self.seen = descendants(self.proc.pid) | {self.proc.pid}
        return ranks

    def finish(self) -> str:
        try:
            _, err = self.proc.communicate(timeout=300)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return err

    def check_clean(self) -> None:
        """No process of the run alive, nothing left in its TMPDIR or in /dev/shm under its
        processes' names, no rank trace, and nothing at the trace path."""
        deadline = time.monotonic() + 10
        while (left := [p for p in self.seen if alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"orphans: {[Path(f'/proc/{p}/cmdline').read_bytes() for p in left]}"
        assert leftovers(self.tmp) == []
        assert shm_of(self.seen) == set()
        assert not self.trace.exists()
        names = sorted(p.name for p in self.dir.iterdir())
        assert names == ["spec.json", "trace.incomplete.h5"], names
        for p in self.dir.iterdir():
            if p.suffix == ".h5":
                with pytest.raises(TraceFormatError):
                    open_trace(p).close()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    r = Run(tmp_path)
    yield r
    if r.proc.poll() is None:
        os.killpg(r.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "jpeg"
    generate(DatasetSpec(samples=32, height=40, width=48), out)
    return out


def leftovers(tmp: Path) -> list[str]:
    """What a run left in its TMPDIR, but for torch's compile cache (``torchinductor_<user>``):
    a cache every run of torch shares and reuses, made whether the run fails or not."""
    return sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))


def last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("killed", [1, 0])
def test_a_sigkilled_rank_is_named_and_the_run_left_clean(run: Run, killed: int) -> None:
    ranks = run.wait_for_steps()
    os.kill(ranks[killed], signal.SIGKILL)
    err = run.finish()
    assert run.proc.returncode == 2, err[-3000:]
    line = last_line(err)
    assert line.startswith("codl run: error: "), err[-3000:]
    assert f"rank {killed} of 2" in line and "SIGKILL" in line, line
    assert str(run.dir / "trace.incomplete.h5") in line, line
    run.check_clean()
    with open_trace(run.dir / "trace.incomplete.h5", allow_incomplete=True) as t:
        assert t.attrs["complete"] is False
        assert [r["rank"] for r in t.attrs["ranks"]] == [1 - killed]


@pytest.mark.parametrize("strategy", ["file_system", "file_descriptor"])
def test_a_sigkilled_loading_rank_leaves_no_shared_memory(
    tmp_path: Path, dataset: Path, strategy: str
) -> None:
    """Rank 1 of a loading run killed while its workers hand it batches through shared memory
    (named files in /dev/shm under ``file_system``): nothing of the run stays in /dev/shm, and
    no worker outlives its rank."""
    spec = {
        **ENDLESS,
        "mode": "combined",
        "workload": {"batch_size": 4, "image_size": 32},
        "dataset": {"samples": 32, "height": 40, "width": 48},
        "loader": {"workers": 1, "sharing_strategy": strategy},
    }
    run = Run(tmp_path, spec, dataset)
    try:
        ranks = run.wait_for_steps()
        os.kill(ranks[1], signal.SIGKILL)
        err = run.finish()
    finally:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
    assert run.proc.returncode == 2, err[-3000:]
    assert "rank 1 of 2 failed: killed by SIGKILL" in last_line(err), err[-3000:]
    run.check_clean()


def test_sigterm_to_codl_run_stops_both_ranks_and_leaves_it_clean(run: Run) -> None:
    run.wait_for_steps()
    run.proc.send_signal(signal.SIGTERM)
    err = run.finish()
    assert run.proc.returncode == 2, err[-3000:]
    assert "SIGTERM" in last_line(err)
    run.check_clean()
    with open_trace(run.dir / "trace.incomplete.h5", allow_incomplete=True) as t:
        assert sorted(r["rank"] for r in t.attrs["ranks"]) == [0, 1]


LAUNCH = """\
import sys
from pathlib import Path
from codl.errors import CodlError
from codl.harness.launch import launch
from codl.spec import RunSpec, loads_json
spec = RunSpec.from_dict(loads_json(Path(sys.argv[1]).read_text(), source=sys.argv[1]))
try:
    launch(spec, trace_path=Path(sys.argv[2]), dataset_dir=Path(sys.argv[3]))
except CodlError as e:
    print(e, file=sys.stderr)
    sys.exit(2)
"""


def test_ranks_raising_leave_no_error_files_behind(tmp_path: Path) -> None:
    """Both ranks raise (an empty data set; ``codl run`` itself would refuse it before the
    launch): torch's per-rank error files in TMPDIR are removed with the rest."""
    spec = RunSpec.from_dict(
        {
            "mode": "data",
            "workload": {"batch_size": 2, "image_size": 16},
            "dataset": {"samples": 4, "classes": 2, "height": 16, "width": 16},
            "loader": {"workers": 1},
            "layout": {"ranks_per_node": 2},
            "steps": {"warmup": 1, "measured": 2},
        }
    )
    run_dir = tmp_path / "run"
    write_spec_json(spec, run_dir / "spec.json")
    empty = tmp_path / "no data"
    empty.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", LAUNCH, run_dir / "spec.json", run_dir / "trace.h5", empty],
        env={**os.environ, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        start_new_session=True,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = last_line(proc.stderr)
    assert " of 2 failed: " in line, line
    assert leftovers(tmp) == []
    assert not (run_dir / "trace.h5").exists()
    assert not list(run_dir.glob("trace.rank*"))


BLOCKS_CONFIG = {
    "defaults": {
        "workload": {"batch_size": 4, "image_size": 32},
        "dataset": {"name": "fault-jpeg", "samples": 32, "height": 40, "width": 48},
        "loader": {"workers": 1},
        "steps": {"warmup": 1, "measured": 2},
    },
    "experiments": [
        {
            "name": "trio",
            "factors": {"mode": ["compute", "data", "data+compute"]},
            "repeats": 2,
        }
    ],
    "blocks": {"order": "abba"},
}


def keep_going(workdir: Path, config: Path, *targets: str) -> tuple[int, str]:
    """Real Snakemake with --keep-going, as tests/test_workflow.py's helper runs it, but
    returning a failure instead of asserting success."""
    from shellenv import without_venv
    from test_workflow import REPO

    cmd = [
        str(Path(sys.executable).parent / "snakemake"),
        "-s",
        str(REPO / "workflow" / "Snakefile"),
        "-d",
        str(workdir),
        "--configfile",
        str(config),
        "--profile",
        str(REPO / "profiles" / "local"),
        "--cores",
        "2",
        "--keep-going",
        *targets,
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=without_venv(), timeout=900, check=False
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_a_run_failing_inside_a_block_stops_its_block_only_and_is_redone(
    tmp_path: Path,
) -> None:
    """The middle run of block 0 fails at start (its kineto directory's path is taken by a
    file, something outside its spec): Snakemake names it, block 0's last run never starts,
    block 1 runs whole, and once the cause is gone a re-run makes exactly the rest of block 0."""
    import yaml

    from codl.config import build_plan, plan_blocks
    from codl.paths import ResultPaths
    from test_workflow import job_counts

    workdir = tmp_path / "work"
    workdir.mkdir()
    cfg_path = tmp_path / "faulty.yaml"
    cfg_path.write_text(yaml.safe_dump(BLOCKS_CONFIG))
    paths = ResultPaths(workdir, set_name="faulty")
    rel = ResultPaths(set_name="faulty")
    block0, block1 = (b.run_ids for b in plan_blocks(BLOCKS_CONFIG, build_plan(BLOCKS_CONFIG)))
    first, failing, after = block0
    targets = [str(rel.trace(rid)) for rid in (*block0, *block1)]
    blocker = paths.kineto_dir(failing)
    blocker.parent.mkdir(parents=True)
    blocker.write_text("not a directory\n")

    rc, out = keep_going(workdir, cfg_path, *targets)
    assert rc != 0, out[-4000:]
    assert "Error in rule run:" in out, out[-4000:]
    assert f"run_id={failing}" in out, out[-4000:]
    assert "exists and is not a directory" in paths.run_log(failing).read_text()
    assert paths.trace(first).exists()
    assert not paths.trace(after).exists()
    assert not paths.run_log(after).exists(), "the run after the failed one started"
    for rid in block1:
        with open_trace(paths.trace(rid)) as t:
            assert t.attrs["complete"] is True
    # Nothing of the failed run that reads as a complete trace.
    run_dir = paths.trace(failing).parent
    for p in run_dir.iterdir():
        if p.suffix == ".h5" or p.name.endswith(".partial"):
            with pytest.raises(TraceFormatError):
                open_trace(p).close()
    assert not paths.trace(failing).exists()

    blocker.unlink()
    rc, out = keep_going(workdir, cfg_path, *targets)
    assert rc == 0, out[-4000:]
    jobs = job_counts(out)
    assert jobs.get("run") == 2, out[-4000:]
    for rid in (*block0, *block1):
        with open_trace(paths.trace(rid)) as t:
            assert t.attrs["complete"] is True


def test_sigkill_of_codl_run_stops_its_ranks(run: Run) -> None:
    """The launcher killed (the OOM killer, a kill -9): its ranks stop as if stopped (torch's
    spawn has the kernel send them SIGINT), each keeping what it measured in its own incomplete
    trace, and leave nothing in TMPDIR (no error file that no one would read)."""
    run.wait_for_steps()
    run.proc.kill()
    run.finish()
    deadline = time.monotonic() + 120
    while (left := [p for p in run.seen if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, "the ranks outlived their launcher"
    assert leftovers(run.tmp) == []
    assert not run.trace.exists()
    for r in (0, 1):
        with open_trace(run.dir / f"trace.rank{r}.incomplete.h5", allow_incomplete=True) as t:
            assert t.attrs["complete"] is False
            assert "received SIGINT" in t.attrs["incomplete_reason"]
