"""Nothing lost, nothing forged: adversarial inputs of issue 22, class by class.

Each test states the property it defends; parametrized cases are the issue's examples plus the
next variants a careful adversary would try.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from codl.cli import main
from codl.config import build_plan
from codl.datasets import MANIFEST, OWNER_MARKER, generate, stage
from codl.errors import CodlError, ConfigError
from codl.spec import DatasetSpec
from shellenv import without_venv

REPO = Path(__file__).resolve().parents[1]
TINY = DatasetSpec(name="tiny", samples=4, classes=2, height=16, width=16)


def tree_digest(root: Path, *, skip: tuple[str, ...] = (".snakemake",)) -> dict[str, str]:
    """Every file and directory under ``root`` (but ``skip``) with a hash of its content."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if rel.parts[0] in skip:
            continue
        if p.is_symlink():
            out[str(rel)] = "link:" + os.readlink(p)
        elif p.is_dir():
            out[str(rel)] = "dir"
        else:
            out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def tier_config(tier: str, *, name: str = "config") -> dict[str, Any]:
    return {
        "defaults": {
            "workload": {"batch_size": 2, "image_size": 16},
            "dataset": {
                "name": name,
                "samples": 4,
                "classes": 2,
                "height": 16,
                "width": 16,
                "tier": "t",
            },
            "loader": {"workers": 1},
            "steps": {"warmup": 1, "measured": 1},
        },
        "tiers": {"t": tier},
        "experiments": [{"name": "e", "factors": {"mode": ["data"]}}],
    }


# --------------------------------------------------------------------------------------------
# Class 1: config values reaching the file system and the shell


def bad_tiers(project: Path, canary: Path) -> list[tuple[str, str, str]]:
    """(label, tier value, dataset name) that must never reach the disk or a shell."""
    return [
        ("empty string deletes config/", "", "config"),
        ("blank", "   ", "config"),
        ("relative dot", ".", "config"),
        ("relative path", "resources", "datasets"),
        ("single quote injection", f"/tmp/x'; touch {canary}; echo '", "d"),
        ("double quote injection", f'/tmp/x"; touch {canary}; echo "', "d"),
        ("command substitution", f"/tmp/$(touch {canary})", "d"),
        ("backticks", f"/tmp/`touch {canary}`", "d"),
        ("newline", f"/tmp/x\ntouch {canary}", "d"),
        ("undefined env var", "$CODL_SURELY_UNDEFINED_VAR/x", "d"),
        ("undefined braced env var", "/tmp/${CODL_SURELY_UNDEFINED_VAR}/x", "d"),
        ("unknown user home", "~codl_no_such_user_xyz/x", "d"),
        ("project itself", str(project), "config"),
        ("inside the project", str(project / "results"), "runs"),
        ("parent of the project", str(project.parent), project.name),
        ("dotdot back into the project", str(project / ".." / project.name), "config"),
        ("file system root", "/", "tmp"),
        ("system directory", "/etc", "codl"),
        ("backslash", "/tmp/a\\b", "d"),
    ]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the workflow (workflow/ with its Snakefile, configs, profiles) to run
    Snakemake in."""
    proj = tmp_path / "project"
    proj.mkdir()
    for name in ("workflow", "config", "profiles"):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, proj / name)  # the schema link becomes a file
        else:
            shutil.copy2(src, proj / name)
    return proj


def test_bad_tier_paths_are_refused_by_the_plan_naming_the_tier(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    canary = tmp_path / "INJECTED"
    for label, tier, name in bad_tiers(proj, canary):
        with pytest.raises(ConfigError) as info:
            build_plan(tier_config(tier, name=name), project_dirs=(proj,))
        assert "tiers.t" in str(info.value) or "would be staged" in str(info.value), label
    assert not canary.exists()


def test_a_symlink_tier_into_the_project_is_refused(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    (proj / "config").mkdir(parents=True)
    link = tmp_path / "scratch"
    link.symlink_to(proj)
    with pytest.raises(ConfigError, match="inside the project directory"):
        build_plan(tier_config(str(link), name="config"), project_dirs=(proj,))


def test_a_tier_above_the_project_is_fine_unless_the_dataset_lands_on_it(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    plan = build_plan(tier_config(str(tmp_path), name="other"), project_dirs=(proj,))
    assert plan.tiers == {"t": str(tmp_path.resolve())}
    with pytest.raises(ConfigError, match="holds the project directory"):
        build_plan(tier_config(str(tmp_path), name="proj"), project_dirs=(proj,))


def test_env_vars_and_home_in_tiers_are_expanded_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    # A value holding `$` is used as is, never expanded a second time.
    monkeypatch.setenv("CODL_SCRATCH", str(tmp_path / "s$HOME"))
    plan = build_plan(tier_config("${CODL_SCRATCH}/tier", name="d"), project_dirs=(proj,))
    assert plan.tiers["t"] == str(tmp_path.resolve() / "s$HOME" / "tier")


@pytest.mark.parametrize(
    "name",
    ["config\n", "a\n", "../config", ".hidden", "a/b", "a'b", "a b", "x" * 65, "", "é"],
)
def test_unsafe_dataset_and_experiment_names_are_refused(name: str) -> None:
    cfg = tier_config("/dev/shm/codl-test", name=name)
    with pytest.raises(ConfigError, match=r"dataset\.name"):
        build_plan(cfg, project_dirs=())
    cfg = tier_config("/dev/shm/codl-test", name="ok")
    cfg["experiments"][0]["name"] = name
    with pytest.raises(ConfigError, match=r"experiments\[0\]"):
        build_plan(cfg, project_dirs=())


def test_a_tier_name_with_a_trailing_newline_is_refused() -> None:
    cfg = tier_config("/dev/shm/codl-test", name="ok")
    cfg["tiers"] = {"t\n": "/dev/shm/codl-test"}
    with pytest.raises(ConfigError, match="invalid key name"):
        build_plan(cfg, project_dirs=())


def snakemake_in(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A fresh shell: the venv's bin (and its codl) not on PATH.
    env = without_venv()
    env.pop("CODL_SURELY_UNDEFINED_VAR", None)
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "snakemake"),
            "--profile",
            "profiles/local",
            "--cores",
            "1",
            *args,
        ],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


@pytest.mark.slow
def test_snakemake_refuses_every_bad_tier_and_leaves_the_project_untouched(
    project: Path, tmp_path: Path
) -> None:
    canary = tmp_path / "INJECTED"
    before = tree_digest(project)
    cfg_dir = tmp_path / "configs"
    cfg_dir.mkdir()
    for i, (label, tier, name) in enumerate(bad_tiers(project, canary)):
        cfg = cfg_dir / f"bad{i}.yaml"
        cfg.write_text(yaml.safe_dump(tier_config(tier, name=name)))
        proc = snakemake_in(project, "--configfile", str(cfg))
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, (label, out[-2000:])
        assert "tiers.t" in out or "would be staged" in out, (label, out[-2000:])
        # The refusal is the plan's short message, not a dump of the schema.
        assert len(out) < 20_000, label
        assert not canary.exists(), label
        assert tree_digest(project) == before, label


@pytest.mark.slow
def test_shell_metacharacters_in_a_tier_path_stay_inside_the_path(
    project: Path, tmp_path: Path
) -> None:
    """A legal but hostile directory name goes through the stage and run rules verbatim."""
    canary = tmp_path / "INJECTED"
    tier = tmp_path / f"tier ü; touch {canary} & (x) | <y> #"
    cfg_path = tmp_path / "ok.yaml"
    cfg = tier_config(str(tier), name="staged")
    cfg_path.write_text(yaml.safe_dump(cfg))
    (run_id,) = build_plan(cfg, project_dirs=(project,)).specs
    before = tree_digest(project, skip=(".snakemake", "resources", "results", "logs"))
    # The target first: --configfile takes every word after it.
    proc = snakemake_in(project, f"results/runs/{run_id}/trace.h5", "--configfile", str(cfg_path))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert not canary.exists()
    assert (tier / "staged" / MANIFEST).is_file()
    assert (tier / "staged" / OWNER_MARKER).is_file()
    assert (project / "results" / "runs" / run_id / "trace.h5").is_file()
    log = (project / "logs" / "run" / f"{run_id}.log").read_text()
    assert "Traceback" not in log
    assert tree_digest(project, skip=(".snakemake", "resources", "results", "logs")) == before


# --------------------------------------------------------------------------------------------
# Class 2: commands delete only directories codl marked as its own


def user_dir(path: Path) -> dict[str, str]:
    path.mkdir(parents=True, exist_ok=True)
    (path / "thesis.tex").write_text("years of work")
    (path / "sub").mkdir(exist_ok=True)
    (path / "sub" / "data.bin").write_bytes(b"\x00\x01")
    return tree_digest(path)


def test_generate_refuses_to_replace_a_directory_codl_did_not_create(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    before = user_dir(out)
    with pytest.raises(CodlError, match="not created by codl"):
        generate(TINY, out)
    assert tree_digest(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]  # no partial left behind


def test_generate_refuses_a_user_manifest_lookalike(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    before_files = user_dir(out)
    (out / MANIFEST).write_text('{"note": "mine"}')
    before = tree_digest(out)
    with pytest.raises(CodlError, match="not created by codl"):
        generate(TINY, out)
    assert tree_digest(out) == before
    assert before_files.items() <= before.items()


def test_generate_replaces_its_own_data_set_and_an_empty_directory(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    out.mkdir()
    generate(TINY, out)
    assert (out / OWNER_MARKER).is_file()
    (out / "stale.txt").write_text("from an older build")
    generate(TINY, out)
    assert not (out / "stale.txt").exists()
    assert (out / MANIFEST).is_file()
    # A data set of an older codl (MANIFEST, no marker) is still recognised as codl's.
    (out / OWNER_MARKER).unlink()
    generate(TINY, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_generate_never_deletes_a_stale_partial_of_the_same_name(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    partial = tmp_path / "ds.partial"
    before = user_dir(partial)
    generate(TINY, out)
    assert tree_digest(partial) == before


@pytest.mark.parametrize("kind", ["symlink to a user dir", "regular file", "fifo"])
def test_generate_refuses_non_directories(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "out"
    victim = tmp_path / "victim"
    before = user_dir(victim)
    if kind == "symlink to a user dir":
        out.symlink_to(victim)
    elif kind == "regular file":
        out.write_text("precious")
    else:
        os.mkfifo(out)
    with pytest.raises(CodlError, match="refusing"):
        generate(TINY, out)
    assert tree_digest(victim) == before
    assert out.exists() or out.is_symlink()


def test_generate_refuses_the_file_system_root() -> None:
    with pytest.raises(CodlError, match="root"):
        generate(TINY, Path("/"))


@pytest.fixture
def built(tmp_path: Path) -> Path:
    src = tmp_path / "resources" / "datasets" / "tiny"
    generate(TINY, src)
    return src


def test_stage_refuses_to_replace_a_foreign_directory(built: Path, tmp_path: Path) -> None:
    target = tmp_path / "tier" / "tiny"
    before = user_dir(target)
    marker = tmp_path / "staged" / "t" / "tiny.json"
    with pytest.raises(CodlError, match="not created by codl"):
        stage(built, target, marker=marker)
    assert tree_digest(target) == before
    assert not marker.exists()


@pytest.mark.parametrize("where", ["itself", "inside", "parent"])
def test_stage_refuses_a_target_overlapping_its_source(
    built: Path, tmp_path: Path, where: str
) -> None:
    target = {"itself": built, "inside": built / "copy", "parent": built.parent}[where]
    before = tree_digest(built.parent)
    with pytest.raises(CodlError, match="overlap"):
        stage(built, target, marker=tmp_path / "m.json")
    assert tree_digest(built.parent) == before


def test_stage_refuses_a_source_that_is_not_a_data_set(tmp_path: Path) -> None:
    src = tmp_path / "notes"
    user_dir(src)
    with pytest.raises(CodlError, match="manifest"):
        stage(src, tmp_path / "tier" / "x", marker=tmp_path / "m.json")


def test_stage_twice_replaces_its_own_copy(built: Path, tmp_path: Path) -> None:
    target = tmp_path / "tier" / "tiny"
    stage(built, target, marker=tmp_path / "m.json")
    (target / "junk").write_text("x")
    stage(built, target, marker=tmp_path / "m.json")
    assert not (target / "junk").exists()
    assert (target / OWNER_MARKER).is_file()
    assert sorted(p.name for p in target.parent.iterdir()) == ["tiny"]


def test_cli_dataset_and_stage_fail_cleanly_and_keep_user_data(
    tmp_path: Path, built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "mine"
    before = user_dir(mine)
    spec = json.dumps({"name": "tiny", "samples": 4, "classes": 2, "height": 16, "width": 16})
    assert main(["dataset", "--spec-json", spec, "--out", str(mine)]) == 2
    assert (
        main(
            [
                "stage",
                str(built / MANIFEST),
                "--to",
                str(mine),
                "--marker",
                str(tmp_path / "m.json"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("not created by codl") == 2
    assert tree_digest(mine) == before
    assert main(["dataset", "--spec-json", "{not json", "--out", str(tmp_path / "x")]) == 2
    assert "--spec-json" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Class 5: outputs never overwrite inputs

COMPUTE_SPEC = {
    "mode": "compute",
    "workload": {"batch_size": 2, "image_size": 16},
    "steps": {"warmup": 1, "measured": 2},
}


@pytest.fixture(scope="module")
def real_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete trace of a real (tiny, CPU) run; tests copy it before touching it."""
    from codl.harness.launch import launch
    from codl.spec import RunSpec

    out = tmp_path_factory.mktemp("real") / "trace.h5"
    launch(RunSpec.from_dict(COMPUTE_SPEC), trace_path=out, dataset_dir=None)
    return out


@pytest.fixture
def trace_copy(real_trace: Path, tmp_path: Path) -> Path:
    p = tmp_path / "t dir ü" / "trace.h5"
    p.parent.mkdir()
    shutil.copy(real_trace, p)
    return p


def output_variants(trace: Path) -> list[tuple[str, Path]]:
    d = trace.parent
    link = d / "link.json"
    link.symlink_to(trace)
    hard = d / "hard.json"
    os.link(trace, hard)
    other = d / "other.h5"
    shutil.copy(trace, other)
    sub = d / "sub"
    sub.mkdir()
    return [
        ("the input itself", trace),
        ("the input via ..", sub / ".." / trace.name),
        ("a symlink to the input", link),
        ("a hard link to the input", hard),
        ("another trace", other),
        ("a directory", sub),
        ("a missing directory", d / "missing" / "x.json"),
    ]


def test_export_refuses_every_output_that_would_destroy_an_input(
    trace_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for label, out in output_variants(trace_copy):
        before = tree_digest(trace_copy.parent)
        assert main(["export", str(trace_copy), "-o", str(out)]) == 2, label
        assert tree_digest(trace_copy.parent) == before, label
        assert "--output" in capsys.readouterr().err, label
    good = trace_copy.parent / "trace.json"
    assert main(["export", str(trace_copy), "-o", str(good)]) == 0
    assert json.loads(good.read_text())["traceEvents"]


def test_summarize_refuses_to_write_over_its_input(
    trace_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    named = trace_copy.parent / "steps.parquet"
    trace_copy.rename(named)
    before = named.read_bytes()
    assert main(["summarize", str(named), "--out-dir", str(named.parent)]) == 2
    assert named.read_bytes() == before
    assert "--out-dir" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Class 3: two writers of one trace path


def test_a_second_writer_of_one_trace_path_fails_at_once(tmp_path: Path) -> None:
    from codl.errors import TraceFormatError
    from codl.files import lock_path
    from codl.trace.store import TraceWriter, open_trace

    final = tmp_path / "t.h5"
    with TraceWriter(final) as first:
        first.set_attrs(spec={"who": "first"})
        with pytest.raises(TraceFormatError, match="another write"), TraceWriter(final):
            pass
        script = (
            "import sys\nfrom codl.trace.store import TraceWriter\n"
            "from codl.errors import TraceFormatError\n"
            f"try:\n    TraceWriter({str(final)!r}).__enter__()\n"
            "except TraceFormatError as e:\n    print(e); sys.exit(3)\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=False
        )
        assert proc.returncode == 3, proc.stderr
        assert f"pid {os.getpid()}" in proc.stdout
        first.finish()
    with open_trace(final) as t:
        assert t.spec == {"who": "first"}
    assert not lock_path(final, "write").exists()
    # Released: the next writer of the path is free to go.
    with TraceWriter(final) as again:
        again.finish()


def test_writers_use_unique_partial_names_and_spare_a_foreign_partial(tmp_path: Path) -> None:
    from codl.trace.store import TraceWriter, partial_path

    final = tmp_path / "t.h5"
    foreign = partial_path(final)
    foreign.write_bytes(b"someone else's bytes")
    a, b = TraceWriter(final), TraceWriter(final)
    assert a.partial_path != b.partial_path
    assert a.partial_path.name.endswith(".partial") and a.partial_path.parent == tmp_path
    with a:
        a.finish()
    assert foreign.read_bytes() == b"someone else's bytes"


def run_cmd(spec_path: Path, trace: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "codl.cli", "run", str(spec_path), "--trace", str(trace), *extra]


@pytest.mark.slow
def test_a_second_codl_run_of_one_trace_fails_before_measuring(tmp_path: Path) -> None:
    from codl.files import lock_path
    from codl.harness.runner import write_spec_json
    from codl.spec import RunSpec
    from codl.trace.store import incomplete_path, open_trace

    long = RunSpec.from_dict({**COMPUTE_SPEC, "steps": {"warmup": 1, "measured": 100_000}})
    spec_path = tmp_path / "spec.json"
    write_spec_json(long, spec_path)
    trace = tmp_path / "trace.h5"
    first = subprocess.Popen(
        run_cmd(spec_path, trace), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not lock_path(trace, "run").exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        second = subprocess.run(
            run_cmd(spec_path, trace), capture_output=True, text=True, timeout=120, check=False
        )
        assert second.returncode == 2, second.stderr
        assert "another run" in second.stderr and "Traceback" not in second.stderr
        time.sleep(3)  # some measured steps
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    assert first.returncode != 0
    assert "SIGTERM" in err
    assert not trace.exists()
    with open_trace(incomplete_path(trace), allow_incomplete=True) as t:
        assert "SIGTERM" in t.attrs["incomplete_reason"]
        assert t.attrs["run_id"] == long.run_id
    assert not lock_path(trace, "run").exists()


# --------------------------------------------------------------------------------------------
# Class 11: late failures; class 6: the wrong data set

EARLY_CHECK = r"""
import json, sys
from pathlib import Path
from codl.cli import main
cases = json.loads(sys.argv[1])
out = {}
for label, argv in cases.items():
    try:
        out[label] = main(argv)
    except SystemExit as exc:  # refused by the argument parser (--cpus-per-task -1)
        out[label] = exc.code
out["torch imported"] = "torch" in sys.modules
print(json.dumps(out))
"""


def test_codl_run_checks_everything_before_importing_torch(tmp_path: Path, built: Path) -> None:
    from codl.harness.runner import write_spec_json
    from codl.spec import RunSpec

    good = tmp_path / "spec.json"
    write_spec_json(RunSpec.from_dict(COMPUTE_SPEC), good)
    loads = tmp_path / "loads.json"
    write_spec_json(
        RunSpec.from_dict(
            {
                "mode": "data",
                "workload": {"batch_size": 2, "image_size": 16},
                "dataset": {"name": "tiny", "samples": 4, "classes": 2, "height": 32},
            }
        ),
        loads,
    )
    a_file = tmp_path / "a file"
    a_file.write_text("x")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{")
    a_list = tmp_path / "list.json"
    a_list.write_text("[1, 2]")
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"mode": "compute", "workers": 3}')
    empty_ds = tmp_path / "empty ds"
    empty_ds.mkdir()
    spec_before = good.read_bytes()
    t = str(tmp_path / "trace.h5")
    cases = {
        "trace under /proc": ["run", str(good), "--trace", "/proc/codl/trace.h5"],
        "trace dir is a file": ["run", str(good), "--trace", str(a_file / "trace.h5")],
        "trace is a directory": ["run", str(good), "--trace", str(tmp_path)],
        "trace named .partial": ["run", str(good), "--trace", t + ".partial"],
        "trace named .incomplete.h5": [
            "run",
            str(good),
            "--trace",
            str(tmp_path / "x.incomplete.h5"),
        ],
        "trace named .lock": ["run", str(good), "--trace", str(tmp_path / ".t.h5.run.lock")],
        "trace is the spec": ["run", str(good), "--trace", str(good)],
        "spec not JSON": ["run", str(bad_json), "--trace", t],
        "spec a list": ["run", str(a_list), "--trace", t],
        "spec unknown key": ["run", str(unknown), "--trace", t],
        "spec missing": ["run", str(tmp_path / "nope.json"), "--trace", t],
        "negative cpus": ["run", str(good), "--trace", t, "--cpus-per-task", "-1"],
        "kineto dir a file": ["run", str(good), "--trace", t, "--kineto-dir", str(a_file)],
        "loads without data set": ["run", str(loads), "--trace", t],
        "data set missing": ["run", str(loads), "--trace", t, "--dataset-dir", str(tmp_path / "n")],
        "data set without manifest": [
            "run",
            str(loads),
            "--trace",
            t,
            "--dataset-dir",
            str(empty_ds),
        ],
        "another data set": ["run", str(loads), "--trace", t, "--dataset-dir", str(built)],
    }
    proc = subprocess.run(
        [sys.executable, "-c", EARLY_CHECK, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result.pop("torch imported") is False
    assert result == dict.fromkeys(cases, 2)
    assert "Traceback" not in proc.stderr
    assert "height: data set has 16, spec wants 32" in proc.stderr
    assert good.read_bytes() == spec_before
    assert not (tmp_path / "trace.h5").exists()


def test_a_data_set_is_matched_against_the_spec_but_not_its_tier(built: Path) -> None:
    from codl.datasets import check_dataset

    check_dataset(TINY, built)
    import dataclasses

    check_dataset(dataclasses.replace(TINY, tier="shm"), built)
    for key, value in (("samples", 5), ("seed", 1), ("quality", 80), ("name", "other")):
        with pytest.raises(CodlError, match=f"{key}: data set has"):
            check_dataset(dataclasses.replace(TINY, **{key: value}), built)


@pytest.mark.parametrize(
    "content", [b"{", b"[]", b'{"spec": 3}', b"\xff\xfe", b" " * (2 << 20), b""]
)
def test_a_damaged_manifest_is_an_error_naming_it(built: Path, content: bytes) -> None:
    from codl.datasets import check_dataset

    (built / MANIFEST).write_bytes(content)
    with pytest.raises(CodlError, match=MANIFEST):
        check_dataset(TINY, built)


# --------------------------------------------------------------------------------------------
# Class 9: the plan refuses what cannot run or means nothing, quickly and briefly


def one_exp(base: dict[str, Any], **exp: Any) -> dict[str, Any]:
    return {"experiments": [{"name": "e", "base": base, **exp}]}


LOADS = {"mode": "data", "loader": {"workers": 1}}


@pytest.mark.parametrize(
    ("label", "cfg", "expected"),
    [
        ("batch over samples", one_exp({**LOADS, "dataset": {"samples": 8}}), "more than dataset"),
        ("lr nan", one_exp({"workload": {"lr": float("nan")}}), "workload.lr"),
        ("lr inf", one_exp({"workload": {"lr": float("inf")}}), "workload.lr"),
        ("lr -inf", one_exp({"workload": {"lr": float("-inf")}}), "workload.lr"),
        ("fork bomb", one_exp({**LOADS, "loader": {"workers": 100_000}}), "loader.workers"),
        ("workers just over", one_exp({**LOADS, "loader": {"workers": 1025}}), "loader.workers"),
        ("huge prefetch", one_exp({**LOADS, "loader": {"prefetch_factor": 10**6}}), "prefetch"),
        ("huge samples", one_exp({**LOADS, "dataset": {"samples": 10**9}}), "dataset.samples"),
        ("huge images", one_exp({**LOADS, "dataset": {"height": 10**6}}), "dataset.height"),
        ("huge steps", one_exp({"steps": {"measured": 10**12}}), "steps.measured"),
        ("huge batch", one_exp({"workload": {"batch_size": 10**7}}), "workload.batch_size"),
        ("many nodes", one_exp({"layout": {"nodes": 10**6}}), "layout.nodes"),
        ("many ranks", one_exp({"layout": {"ranks_per_node": 10**4}}), "ranks_per_node"),
        ("huge repeats", one_exp({}, repeats=10**9), "expected at most 10000"),
        (
            "huge product",
            one_exp(
                {},
                factors={"seed": list(range(100)), "workload.lr": [0.1 * i for i in range(1, 200)]},
            ),
            "expected at most 10000",
        ),
    ],
)
def test_plan_limits(label: str, cfg: dict[str, Any], expected: str) -> None:
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        build_plan(cfg, project_dirs=())
    assert expected in str(info.value), label
    assert time.monotonic() - start < 5, label
    assert len(str(info.value)) < 5_000, label


def test_many_experiments_together_are_capped_too() -> None:
    # Each within the limit, together over it: refused before the second one is expanded.
    cfg = {"experiments": [{"name": "a", "repeats": 10}, {"name": "b", "repeats": 9995}]}
    with pytest.raises(ConfigError, match="in the whole config"):
        build_plan(cfg, project_dirs=())


def test_limits_hold_for_a_spec_given_to_codl_run_directly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nan_spec = tmp_path / "nan.json"
    nan_spec.write_text('{"mode": "compute", "workload": {"lr": NaN}}')
    assert main(["run", str(nan_spec), "--trace", str(tmp_path / "t.h5")]) == 2
    assert "workload.lr" in capsys.readouterr().err
    many = tmp_path / "many.json"
    many.write_text('{"mode": "data", "loader": {"workers": 1000}}')
    assert main(["run", str(many), "--trace", str(tmp_path / "t.h5")]) == 2
    assert "per CPU" in capsys.readouterr().err
    assert not (tmp_path / "t.h5").exists()


def alias_bomb(levels: int = 9, width: int = 10) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        refs = ", ".join([f"*a{i - 1}"] * width)
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines.append(f"experiments: [{{name: e, base: {{seed: *a{levels - 1}}}}}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("label", "content", "expected"),
    [
        ("alias bomb", alias_bomb().encode(), "aliases"),
        ("alias bomb in a value", alias_bomb().replace("a0:", "x0:").encode(), "aliases"),
        ("deep nesting", b"experiments: " + b"[" * 2_000 + b"]" * 2_000, "nesting depth"),
        ("nesting under the parser's cap", b"a: " + b"[" * 900 + b"]" * 900, "nested too deeply"),
        ("huge file", b"# " + b"x" * (2 << 20) + b"\n", "bytes"),
        ("not UTF-8", b"experiments: [{name: \xff\xfe}]\n", "UTF-8"),
        ("duplicate key", b"experiments: []\nexperiments: []\n", "duplicate key"),
        ("a list", b"- 1\n- 2\n", "expected a mapping"),
        ("python tag", b"experiments: !!python/object:os.system [echo]\n", "YAML error"),
    ],
)
def test_hostile_yaml_is_refused_quickly_with_a_short_message(
    tmp_path: Path, label: str, content: bytes, expected: str
) -> None:
    from codl.config import load_plan

    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_plan(path)
    assert time.monotonic() - start < 10, label
    assert expected in str(info.value), (label, str(info.value)[:500])
    assert len(str(info.value)) < 5_000, label


def test_thousands_of_problems_make_a_bounded_message() -> None:
    cfg = {"experiments": [{"name": f"e{i}", "base": {"seed": -i - 1}} for i in range(5000)]}
    with pytest.raises(ConfigError) as info:
        build_plan(cfg, project_dirs=())
    assert len(info.value.problems) == 5000
    assert "and 4950 more" in str(info.value)
    assert len(str(info.value)) < 50_000


# --------------------------------------------------------------------------------------------
# Class 10: one config loader for the CLI and the workflow

GOOD_YAML = """\
defaults:
  workload: {batch_size: 2, image_size: 16}
experiments:
  - name: e
    factors: {mode: [compute]}
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("label", "text", "expected"),
    [
        (
            "duplicate top-level key",
            GOOD_YAML + "experiments:\n  - name: other\n",
            "duplicate key 'experiments'",
        ),
        (
            "duplicate nested key",
            GOOD_YAML.replace("batch_size: 2,", "batch_size: 2, batch_size: 64,"),
            "duplicate key 'batch_size'",
        ),
        ("unknown top-level key", GOOD_YAML + "experiment: []\n", "did you mean 'experiments'"),
        ("alias bomb", GOOD_YAML + alias_bomb().split("experiments:")[0], "aliases"),
    ],
)
def test_snakemake_and_codl_plan_refuse_the_same_files_alike(
    project: Path, tmp_path: Path, label: str, text: str, expected: str
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    plan = subprocess.run(
        [sys.executable, "-m", "codl.cli", "plan", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert plan.returncode == 2, (label, plan.stderr)
    assert expected in plan.stderr, (label, plan.stderr)
    proc = snakemake_in(project, "--dry-run", "--configfile", str(cfg))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, (label, out[-3000:])
    assert expected in out, (label, out[-3000:])
    # The plan's message, not Snakemake's dump of the schema.
    assert len(out) < 10_000, (label, len(out))


# --------------------------------------------------------------------------------------------
# Class 8: merging ranks checks run, rank set, attempt and completeness


def fake_rank(
    trace: Path, rank: int, world: int, run_id: str, *, job: str = "", complete: bool = True
) -> Path:
    from codl.trace.schema import TABLES
    from codl.trace.store import TraceWriter
    from codl.trace.store.merge import rank_trace_path

    path = rank_trace_path(trace, rank)
    with TraceWriter(path) as w:
        w.set_attrs(
            run_id=run_id,
            spec={"layout": {"ranks_per_node": world}},
            rank=rank,
            world_size=world,
            slurm_job_id=job,
            t_begin_ns=100 + rank,
            t_end_ns=200 + rank,
        )
        cols = {c.name: [rank] if not c.is_symbol else [f"r{rank}"] for c in TABLES["threads"]}
        w.append("threads", cols)
        if complete:
            w.finish()
        else:
            w.abort("killed by the test")
    return path


def test_ranks_of_one_run_merge_into_one_complete_trace(tmp_path: Path) -> None:
    from codl.trace.store import open_trace
    from codl.trace.store.merge import merge_rank_traces

    trace = tmp_path / "trace.h5"
    parts = [fake_rank(trace, r, 2, "a" * 12) for r in range(2)]
    merge_rank_traces(trace, 2, run_id="a" * 12)
    with open_trace(trace) as t:
        assert [x["rank"] for x in t.attrs["ranks"]] == [0, 1]
        assert sorted(t.table("threads")["rank"]) == [0, 1]
    assert not any(p.exists() for p in parts)


@pytest.mark.parametrize(
    "fault",
    [
        "another run's rank",
        "both ranks of another run",
        "rank attribute swapped",
        "world size differs",
        "stale rank of an earlier Slurm job",
        "a rank aborted",
    ],
)
def test_merge_refuses_ranks_that_are_not_one_attempt_of_one_run(
    tmp_path: Path, fault: str
) -> None:
    from codl.trace.store.merge import merge_rank_traces, rank_trace_path

    trace = tmp_path / "trace.h5"
    rid, other = "a" * 12, "b" * 12
    fake_rank(trace, 0, 2, other if fault == "both ranks of another run" else rid, job="7")
    if fault == "another run's rank":
        fake_rank(trace, 1, 2, other, job="7")
    elif fault == "rank attribute swapped":
        fake_rank(tmp_path / "x.h5", 0, 2, rid, job="7").rename(rank_trace_path(trace, 1))
    elif fault == "world size differs":
        fake_rank(trace, 1, 3, rid, job="7")
    elif fault == "stale rank of an earlier Slurm job":
        fake_rank(trace, 1, 2, rid, job="6")
    elif fault == "a rank aborted":
        fake_rank(trace, 1, 2, rid, job="7", complete=False)
    else:
        fake_rank(trace, 1, 2, other, job="7")
    before = tree_digest(tmp_path)
    start = time.monotonic()
    with pytest.raises(CodlError, match="nothing merged"):
        merge_rank_traces(trace, 2, run_id=rid)
    assert time.monotonic() - start < 30  # an aborted rank is not waited for
    assert tree_digest(tmp_path) == before  # the parts stay; nothing was written


def test_a_rank_part_is_not_taken_for_the_run_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from codl.errors import TraceFormatError
    from codl.trace.store import open_trace, set_aside_stale

    part = fake_rank(tmp_path / "trace.h5", 1, 2, "a" * 12)
    with pytest.raises(TraceFormatError, match="merge did not finish"):
        open_trace(part)
    assert main(["inspect", str(part)]) == 2
    assert "merge did not finish" in capsys.readouterr().err
    assert main(["inspect", str(part), "--allow-incomplete", "--json"]) == 0
    stale = set_aside_stale(part)
    assert stale is not None and not part.exists()
    with open_trace(stale, allow_incomplete=True) as t:
        assert t.attrs["rank"] == 1


# --------------------------------------------------------------------------------------------
# Class 7: signals, repeated and group-wide, leave exactly one incomplete trace with its reason


def wait_for_loader_workers(proc: subprocess.Popen[str], n: int, timeout: float = 180) -> None:
    """Until the run has forked its ``n`` loader workers: the steps begin right after."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + timeout
    while len(children.read_text().split()) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never started its loader workers"
        time.sleep(0.2)


def _start_endless_loading_run(tmp_path: Path) -> tuple[Path, subprocess.Popen[str]]:
    """A 1-rank combined run with 2 loader workers and no end, in its own process group."""
    from codl.harness.runner import write_spec_json
    from codl.spec import RunSpec

    data = tmp_path / "data"
    generate(DatasetSpec(samples=16, classes=2, height=16, width=16), data)
    spec = RunSpec.from_dict(
        {
            "mode": "combined",
            "workload": {"batch_size": 2, "image_size": 16},
            "dataset": {"samples": 16, "classes": 2, "height": 16, "width": 16},
            "loader": {"workers": 2},
            "steps": {"warmup": 1, "measured": 100_000},
        }
    )
    run_dir = tmp_path / "run"
    write_spec_json(spec, run_dir / "spec.json")
    proc = subprocess.Popen(
        [*run_cmd(run_dir / "spec.json", run_dir / "trace.h5"), "--dataset-dir", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a Slurm job step has
    )
    return run_dir, proc


@pytest.mark.slow
@pytest.mark.parametrize(
    ("label", "sig", "group", "repeats"),
    [
        ("SIGTERM three times to the run", signal.SIGTERM, False, 3),
        ("SIGTERM twice to the process group (Slurm)", signal.SIGTERM, True, 2),
        ("SIGINT to the process group (Ctrl-C)", signal.SIGINT, True, 1),
    ],
)
def test_signals_leave_exactly_one_incomplete_trace_with_its_reason(
    tmp_path: Path, label: str, sig: signal.Signals, group: bool, repeats: int
) -> None:
    from codl.trace.store import open_trace

    run_dir, proc = _start_endless_loading_run(tmp_path)
    wait_for_loader_workers(proc, 2)
    time.sleep(5)  # some steps after the workers came up
    assert proc.poll() is None, proc.communicate()
    for _ in range(repeats):
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        time.sleep(0.05)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (label, err[-3000:])
    assert "Traceback" not in err, (label, err[-3000:])
    files = sorted(p.name for p in run_dir.iterdir())
    assert files == ["spec.json", "trace.incomplete.h5"], (label, files)
    with open_trace(run_dir / "trace.incomplete.h5", allow_incomplete=True) as t:
        assert sig.name in t.attrs["incomplete_reason"], label
        steps = t.table("events/app")
        assert (steps["phase"].astype(str) == "step").sum() >= 1, label
        assert len(t.table("events/loader")) > 0, label


@pytest.mark.slow
def test_a_repeat_after_the_trace_is_written_leaves_exit_status_2(tmp_path: Path) -> None:
    """The rest of a kill landing after the stopped run wrote its trace, while the process ends
    (torch's teardown takes a second or more), as a loaded machine delays a kill's repeats:
    CPython resets Python-level handlers to the default when it finalizes, so without the run
    command ignoring them then, a repeat ended the process by SIGTERM (rc -15)."""
    from codl.files import REPEAT_IGNORE_S
    from codl.trace.store import open_trace

    run_dir, proc = _start_endless_loading_run(tmp_path)
    wait_for_loader_workers(proc, 2)
    time.sleep(2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    first = time.monotonic()
    kept = run_dir / "trace.incomplete.h5"
    while not kept.exists() and proc.poll() is None and time.monotonic() < first + 120:
        time.sleep(0.01)
    # From the moment the trace is there until the process is gone, a repeat every 20 ms; all
    # of them repeats of the kill (a signal later than REPEAT_IGNORE_S is a new one).
    repeats = 0
    while proc.poll() is None and time.monotonic() < first + 0.8 * REPEAT_IGNORE_S:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
            repeats += 1
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    assert repeats > 0, "the run ended before any repeat could be sent"
    assert proc.returncode == 2, (repeats, err[-3000:])
    assert sorted(p.name for p in run_dir.iterdir()) == ["spec.json", "trace.incomplete.h5"]
    with open_trace(kept, allow_incomplete=True) as t:
        assert "SIGTERM" in t.attrs["incomplete_reason"]


@pytest.mark.slow
def test_a_failed_rank_is_a_clear_error_and_keeps_what_was_measured(tmp_path: Path) -> None:
    from codl.harness.launch import launch
    from codl.spec import RunSpec

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
    empty = tmp_path / "no data"  # every rank fails to read it
    empty.mkdir()
    with pytest.raises(CodlError, match=r"rank \d of 2 failed"):
        launch(spec, trace_path=tmp_path / "trace.h5", dataset_dir=empty)
    assert not (tmp_path / "trace.h5").exists()


def spawned_ranks(pid: int) -> list[int]:
    """PIDs of the rank processes torch.multiprocessing spawned under ``pid``, in rank order."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    ranks = []
    for child in map(int, children):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"spawn_main" in cmdline:
            ranks.append(child)
    return sorted(ranks)


def _start_endless_two_rank_run(tmp_path: Path) -> tuple[Any, Path, subprocess.Popen[str]]:
    """A 2-rank local compute+comm run with no end, returned once both ranks are about to
    step: stopped earlier, rank 1 would leave its peer blocked in the rendezvous, where no
    signal handler runs."""
    from codl.harness.runner import write_spec_json
    from codl.spec import RunSpec

    spec = RunSpec.from_dict(
        {
            "mode": "compute+comm",
            "workload": {"batch_size": 2, "image_size": 16},
            "layout": {"ranks_per_node": 2},
            "steps": {"warmup": 1, "measured": 100_000},
        }
    )
    run_dir = tmp_path / "run"
    write_spec_json(spec, run_dir / "spec.json")
    proc = subprocess.Popen(
        run_cmd(run_dir / "spec.json", run_dir / "trace.h5"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while len(ranks := spawned_ranks(proc.pid)) < 2 or not all(map(sampling, ranks)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the ranks never reached their first step"
            time.sleep(0.2)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return spec, run_dir, proc


@pytest.mark.slow
@pytest.mark.parametrize("killed", [1, 0])
def test_killing_one_rank_keeps_the_survivors_data(tmp_path: Path, killed: int) -> None:
    """SIGKILL of either rank of a 2-rank local run: the other's data, merged into the run's
    one incomplete trace with the reasons."""
    from codl.trace.store import open_trace

    survivor = 1 - killed
    spec, run_dir, proc = _start_endless_two_rank_run(tmp_path)
    try:
        time.sleep(3)
        os.kill(spawned_ranks(proc.pid)[killed], signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, err[-3000:]
    assert "of 2 failed" in err and "Traceback" not in err, err[-3000:]
    # The survivor's data, merged into the run's one incomplete trace; no rank trace is left.
    # (The launcher removes the killed rank's unreadable streaming partial and its lock once
    # the ranks have ended; a partial is never read as a trace: tests/test_rank_faults.py.)
    kept = run_dir / "trace.incomplete.h5"
    names = [p.name for p in run_dir.iterdir()]
    visible = sorted(n for n in names if not n.startswith(".") and not n.endswith(".partial"))
    assert visible == ["spec.json", "trace.incomplete.h5"]
    assert str(kept) in err
    with open_trace(kept, allow_incomplete=True) as t:
        assert [r["rank"] for r in t.attrs["ranks"]] == [survivor]
        assert t.attrs["run_id"] == spec.run_id
        # Why it stopped: the collective that lost its peer, or the launcher's SIGTERM. How many
        # steps it holds depends on how far the ranks got on a loaded machine: not asserted.
        assert f"rank {killed} of 2 failed" in t.attrs["incomplete_reason"]
        assert f"rank {survivor}: " in t.attrs["incomplete_reason"]
        # What the survivor measured before it stopped: its threads and the scheduler sample
        # taken before its first step (the test waited for it).
        for table in ("threads", "samples/sched"):
            assert set(t.table(table)["rank"]) == {survivor}, table


FAKE_SRUN = """\
import os, subprocess, sys
# srun as codl's launcher calls it (codl.harness.launch.srun_command), on this one machine:
# --ntasks copies of the command, each with the SLURM_* variables of its place (what submitit
# reads); exits 1 when any task failed, once all have ended.
args = sys.argv[1:]
n = next(int(a.split("=")[1]) for a in args if a.startswith("--ntasks="))
cmd = args[next(i for i, a in enumerate(args) if not a.startswith("--")) :]
place = {"SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_NTASKS": str(n)}
ranks = [{"SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)} for r in range(n)]
tasks = [subprocess.Popen(cmd, env={**os.environ, **place, **rank}) for rank in ranks]
sys.exit(1 if any(t.wait() != 0 for t in tasks) else 0)
"""


@pytest.mark.slow
def test_a_failed_srun_step_keeps_the_survivors_data_in_one_incomplete_trace(
    tmp_path: Path,
) -> None:
    """The run's ranks as the tasks of an srun step (a stand-in srun on this machine) and one of
    them SIGKILLed: the process that started srun merges what the other wrote into the run's
    one incomplete trace, as a local run does; it used to leave the rank's own file only."""
    from codl.harness.runner import write_spec_json
    from codl.spec import RunSpec
    from codl.trace.store import open_trace

    srun = tmp_path / "bin" / "srun"
    srun.parent.mkdir()
    srun.write_text(f"#!{sys.executable}\n{FAKE_SRUN}")
    srun.chmod(0o755)
    spec = RunSpec.from_dict(
        {
            "mode": "compute+comm",
            "workload": {"batch_size": 2, "image_size": 16},
            "layout": {"ranks_per_node": 2},
            "steps": {"warmup": 1, "measured": 100_000},
        }
    )
    run_dir = tmp_path / "run"
    write_spec_json(spec, run_dir / "spec.json")
    env = {
        **os.environ,
        "PATH": f"{srun.parent}{os.pathsep}{os.environ['PATH']}",
        # A job id of its own: submitit derives the rendezvous port from it.
        "SLURM_JOB_ID": str(10_000 + os.getpid() % 50_000),
    }
    proc = subprocess.Popen(
        run_cmd(run_dir / "spec.json", run_dir / "trace.h5"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        tasks: list[int] = []
        while len(tasks) < 2 or not all(map(sampling, tasks)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the tasks never reached their first step"
            time.sleep(0.2)
            steps = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            with contextlib.suppress(FileNotFoundError, IndexError):
                tasks = sorted(
                    map(int, Path(f"/proc/{steps[0]}/task/{steps[0]}/children").read_text().split())
                )
        time.sleep(2)
        os.kill(tasks[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, err[-3000:]
    # The launcher's one line last (each task's own log, above it, may hold its traceback: on
    # a cluster it is the job's output).
    last = err.strip().splitlines()[-1]
    assert last.startswith("codl run: error: srun exited with 1"), err[-3000:]
    kept = run_dir / "trace.incomplete.h5"
    assert str(kept) in last, err[-3000:]
    names = [p.name for p in run_dir.iterdir()]
    visible = sorted(n for n in names if not n.startswith(".") and not n.endswith(".partial"))
    assert visible == ["spec.json", "trace.incomplete.h5"], names
    with open_trace(kept, allow_incomplete=True) as t:
        assert [r["rank"] for r in t.attrs["ranks"]] == [0]
        assert t.attrs["run_id"] == spec.run_id
        assert t.attrs["incomplete_reason"].startswith("srun exited with 1")
        assert "rank 0: " in t.attrs["incomplete_reason"]
        for table in ("threads", "samples/sched"):
            assert set(t.table(table)["rank"]) == {0}, table


def test_a_stale_rank_file_of_an_earlier_attempt_is_kept_but_never_merged(
    tmp_path: Path,
) -> None:
    """A rank trace an earlier attempt left (complete, or incomplete after it failed) is set
    aside under a stale name before the ranks start: not merged into this attempt's trace, not
    taken by rank 0's merge for this attempt's rank having failed, and not lost."""
    from codl.errors import TraceFormatError
    from codl.harness.launch import launch
    from codl.spec import RunSpec
    from codl.trace.store import incomplete_path, open_trace
    from codl.trace.store.merge import merge_rank_traces

    trace = tmp_path / "trace.h5"
    # What rank 0 of an srun step saw: rank 1 not done yet, and an earlier attempt's
    # trace.rank1.incomplete.h5 there. Without setting it aside, the merge gives up at once.
    fake_rank(trace, 0, 2, "a" * 12)
    fake_rank(trace, 1, 2, "a" * 12, complete=False)
    assert (tmp_path / "trace.rank1.incomplete.h5").exists()
    with pytest.raises(TraceFormatError, match="rank 1 did not finish"):
        merge_rank_traces(trace, 2, run_id="a" * 12)
    for p in tmp_path.iterdir():
        p.unlink()
    # A real 2-rank run over an earlier attempt's leftovers of both kinds.
    stale_bytes = {}
    for complete in (True, False):
        p = fake_rank(trace, 1, 2, "b" * 12, complete=complete)
        p = p if complete else incomplete_path(p)
        stale_bytes[p.name] = p.read_bytes()
    spec = RunSpec.from_dict(
        {
            "mode": "compute+comm",
            "workload": {"batch_size": 2, "image_size": 16},
            "layout": {"ranks_per_node": 2},
            "steps": {"warmup": 1, "measured": 2},
        }
    )
    launch(spec, trace_path=trace, dataset_dir=None)
    with open_trace(trace) as t:
        assert [r["rank"] for r in t.attrs["ranks"]] == [0, 1]
        assert t.attrs["run_id"] == spec.run_id
    assert not (tmp_path / "trace.rank1.h5").exists()
    assert not (tmp_path / "trace.rank1.incomplete.h5").exists()
    kept = sorted(p for p in tmp_path.iterdir() if ".stale-" in p.name)
    assert len(kept) == 2
    assert sorted(p.read_bytes() for p in kept) == sorted(stale_bytes.values())


@pytest.mark.slow
def test_an_earlier_attempts_incomplete_trace_is_kept_by_the_next_attempt(
    tmp_path: Path,
) -> None:
    """A rerun of a run that failed (the workflow's retry, a user's second try) keeps what the
    failed attempt measured: its trace.incomplete.h5 is set aside under a stale name, never
    replaced by the next attempt's own incomplete trace."""
    from codl.harness.launch import launch
    from codl.spec import RunSpec
    from codl.trace.store import TraceWriter

    trace = tmp_path / "trace.h5"
    with TraceWriter(trace) as w:
        w.set_attrs(run_id="c" * 12, t_begin_ns=1, t_end_ns=2)
        w.abort("killed in the earlier attempt")
    earlier = (tmp_path / "trace.incomplete.h5").read_bytes()
    launch(RunSpec.from_dict(COMPUTE_SPEC), trace_path=trace, dataset_dir=None)
    kept = [p for p in tmp_path.iterdir() if ".stale-" in p.name]
    assert [p.read_bytes() for p in kept] == [earlier]
    assert trace.exists() and not (tmp_path / "trace.incomplete.h5").exists()


def sampling(pid: int) -> bool:
    """Whether rank process ``pid`` has taken its first scheduler sample, which it does right
    before its first step (it then holds its threads' /proc status files open)."""
    links = []
    with contextlib.suppress(FileNotFoundError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                links.append(os.readlink(fd))
    return any("/task/" in link and link.endswith("/status") for link in links)


@pytest.mark.slow
def test_a_group_sigterm_to_local_ranks_leaves_one_merged_incomplete_trace(
    tmp_path: Path,
) -> None:
    """What Slurm sends at a time limit (SIGTERM to every process of the group, twice) to a
    2-rank local run: one trace.incomplete.h5 with the reason and both ranks' data."""
    from codl.trace.store import open_trace

    _spec, run_dir, proc = _start_endless_two_rank_run(tmp_path)
    try:
        time.sleep(5)  # a few steps of a tiny model, even on a loaded machine
        for _ in range(2):
            os.killpg(proc.pid, signal.SIGTERM)
            time.sleep(0.05)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    files = sorted(p.name for p in run_dir.iterdir())
    assert files == ["spec.json", "trace.incomplete.h5"], (files, err[-3000:])
    with open_trace(run_dir / "trace.incomplete.h5", allow_incomplete=True) as t:
        reason = t.attrs["incomplete_reason"]
        assert reason.startswith("received SIGTERM"), reason
        assert "rank 0: " in reason and "rank 1: " in reason, reason
        assert [r["rank"] for r in t.attrs["ranks"]] == [0, 1]
        # What both ranks had measured when the signal came: their threads and the scheduler
        # sample taken before the first step (the test waited for it). How many steps they
        # made on a loaded machine is not asserted.
        for table in ("threads", "samples/sched"):
            assert set(t.table(table)["rank"]) == {0, 1}, table


# --------------------------------------------------------------------------------------------
# Class 12: tests/slurm/cluster.sh waits for the dpkg lock


def apt_get_function() -> str:
    """log() and apt_get() of cluster.sh, to run against a fake apt-get."""
    text = (REPO / "tests" / "slurm" / "cluster.sh").read_text()
    log = next(line for line in text.splitlines() if line.startswith("log()"))
    start = text.index("APT_LOCK_TRIES=")
    end = text.index("\n}\n", text.index("apt_get() {")) + 3
    return log + "\n" + text[start:end]


@pytest.mark.parametrize(
    ("label", "failures", "message", "expected_rc", "expected_calls"),
    [
        (
            "lock held twice, then free",
            2,
            "E: Could not get lock /var/lib/dpkg/lock-frontend",
            0,
            3,
        ),
        ("lists lock", 1, "E: Could not get lock /var/lib/apt/lists/lock", 0, 2),
        ("old dpkg wording", 1, "E: Unable to acquire the dpkg frontend lock", 0, 2),
        ("lock never freed", 99, "E: Could not get lock /var/lib/dpkg/lock", 100, 4),
        ("another error is not retried", 99, "E: Unable to locate package nope", 100, 1),
    ],
)
def test_cluster_sh_apt_get_waits_for_the_dpkg_lock(
    tmp_path: Path,
    label: str,
    failures: int,
    message: str,
    expected_rc: int,
    expected_calls: int,
) -> None:
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "apt-get"
    fake.parent.mkdir()
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {calls}\n'
        f"n=$(wc -l < {calls})\n"
        f'if (( n <= {failures} )); then echo "{message}" >&2; exit 100; fi\n'
        'echo "installed $*"\n'
    )
    fake.chmod(0o755)
    script = apt_get_function() + "\nsleep() { :; }\napt_get install -y pkg\n"
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    env["CODL_APT_LOCK_TRIES"] = "4"
    proc = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == expected_rc, (label, proc.stderr)
    lines = calls.read_text().splitlines()
    assert len(lines) == expected_calls, label
    assert all("DPkg::Lock::Timeout=60 install -y pkg" in line for line in lines), label
    if expected_rc == 0:
        assert "installed" in proc.stdout, label
    else:
        assert message in proc.stderr, label


def cluster_sh_functions(*names: str) -> str:
    """The named shell functions of cluster.sh, to run on their own."""
    text = (REPO / "tests" / "slurm" / "cluster.sh").read_text()
    out = []
    for name in names:
        start = text.index(f"\n{name}() {{") + 1
        one_line = text[start:].split("\n", 1)[0]
        end = (
            start + len(one_line) + 1 if one_line.endswith("}") else text.index("\n}\n", start) + 3
        )
        out.append(text[start:end])
    return "\n".join(out)


@pytest.mark.parametrize(
    ("label", "chain", "expected_rc", "within_s"),
    [
        # The PID runs bash for 1.5 s before it execs the daemon: `alive` would say no.
        ("slow chain of execs, then the daemon", 'sleep 1.5; exec "$0"', 0, 30),
        ("the starter fails before the daemon", "sleep 0.5; exit 1", 1, 10),
    ],
)
def test_cluster_sh_waits_for_a_daemon_still_being_started(
    tmp_path: Path, label: str, chain: str, expected_rc: int, within_s: float
) -> None:
    """cluster.sh's wait_daemon on a daemon whose start is slow (as under load): it waits while
    the PID is still in start's chain of execs, and gives up at once when it exited."""
    daemon = tmp_path / "bin" / "fakedmn"
    daemon.parent.mkdir()
    daemon.write_text(f"#!/usr/bin/env bash\nsleep 1\ntouch {tmp_path}/ready\nexec sleep 60\n")
    daemon.chmod(0o755)
    (tmp_path / "pid").mkdir()
    (tmp_path / "log").mkdir()
    functions = cluster_sh_functions("log", "pid_of", "alive", "running", "start", "wait_daemon")
    script = (
        f"set -euo pipefail\nSTATE={tmp_path}\n{functions}\n"
        f"start fakedmn bash -c '{chain}' {daemon}\n"
        f"rc=0; wait_daemon fakedmn 60 test -e {tmp_path}/ready || rc=$?\n"
        'kill "$(pid_of fakedmn)" 2>/dev/null || true\nexit $rc\n'
    )
    t0 = time.monotonic()
    proc = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == expected_rc, (label, proc.stderr)
    assert time.monotonic() - t0 < within_s, label
    assert (tmp_path / "ready").exists() == (expected_rc == 0), label


# --------------------------------------------------------------------------------------------
# Class 4: metadata integrity; the fuzz test of single-bit flips over a real trace


def test_a_flipped_bit_in_the_spec_attribute_is_caught(trace_copy: Path) -> None:
    """The issue's example: one bit turns the stored worker count into another valid number."""
    from codl.errors import TraceFormatError
    from codl.trace.store import open_trace

    data = bytearray(trace_copy.read_bytes())
    at = data.find(b'"workers": 2')
    assert at > 0
    data[at + len(b'"workers": ')] ^= 0x01  # '2' -> '3'
    trace_copy.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError, match="sha256"):
        open_trace(trace_copy)


@pytest.mark.parametrize(
    "edit",
    [
        "spec edited, digest rewritten",
        "run_id edited, digest rewritten",
        "rows shrunk",
        "rows attribute removed",
        "negative duration, digests rewritten",
        "extent grown",
        "extent grown to 2**40, digest rewritten",
        "unknown dataset",
    ],
)
def test_edited_metadata_is_refused(trace_copy: Path, edit: str) -> None:
    """Deliberate edits with h5py, including ones that recompute the digests."""
    import h5py
    import numpy as np

    from codl.errors import TraceFormatError
    from codl.trace.store import DIGEST_ATTR, open_trace
    from codl.trace.store.layout import metadata_digest

    with h5py.File(trace_copy, "r+") as f:
        if edit.startswith("spec edited"):
            spec = json.loads(f.attrs["spec"])
            spec["workload"]["batch_size"] = 3
            f.attrs["spec"] = json.dumps(spec)
        elif edit.startswith("run_id"):
            f.attrs["run_id"] = "0" * 12
        elif edit == "rows shrunk":
            f["events/app"].attrs["rows"] = 1
        elif edit == "rows attribute removed":
            del f["events/app"].attrs["rows"]
        elif edit.startswith("negative"):
            ds = f["events/app/end_ns"]
            ds[0] = f["events/app/start_ns"][0] - 1
            del f["events/app"].attrs["sha256"]  # no column digest to give it away
        elif edit == "extent grown":
            f["events/app/end_ns"].resize((f["events/app/end_ns"].shape[0] + 10**6,))
        elif edit.startswith("extent grown to"):
            # What made verify() loop for ever: every column and the row count agree.
            for name in list(f["events/app"]):
                f["events/app"][name].resize((2**40,))
            f["events/app"].attrs["rows"] = 2**40
        else:
            f.create_dataset("events/app/extra", data=np.zeros(3))
        if "digest rewritten" in edit or "digests rewritten" in edit:
            f.attrs[DIGEST_ATTR] = metadata_digest(f)
    with (
        pytest.raises(TraceFormatError, match=re.escape(str(trace_copy))),
        open_trace(trace_copy) as t,
    ):
        t.verify()


FUZZ_WORKER = r"""
import hashlib, json, sys
from pathlib import Path
from codl.errors import TraceFormatError
from codl.trace.store import open_trace

base = Path(sys.argv[1]).read_bytes()
work = Path(sys.argv[2])

def outcome(path):
    try:
        with open_trace(path) as t:
            t.verify()
            h = hashlib.sha256(json.dumps(t.attrs, sort_keys=True, default=str).encode())
            for name in t.tables():
                h.update(name.encode() + t.table(name).to_json().encode())
            h.update("\0".join(t.strings).encode())
            return h.hexdigest()
    except TraceFormatError:
        return "error"
    except BaseException as e:
        return f"crash {type(e).__name__}: {str(e)[:200]}"

work.write_bytes(base)
print("baseline", outcome(work), flush=True)
for line in sys.stdin:
    bit = int(line)
    data = bytearray(base)
    data[bit // 8] ^= 1 << (bit % 8)
    work.write_bytes(bytes(data))
    print(bit, outcome(work), flush=True)
"""


def flip_positions(data: bytes, n_random: int, n_spec: int) -> list[int]:
    """Deterministic bit positions: anywhere in the file, and inside the stored spec text."""
    import random

    rng = random.Random(22)
    bits = rng.sample(range(len(data) * 8), n_random)
    at = data.find(b'{"dataset"')
    if at >= 0:
        bits += rng.sample(range(at * 8, (at + 400) * 8), n_spec)
    bits += list(range(0, 64 * 8, 7))  # the superblock
    return list(dict.fromkeys(bits))


@pytest.mark.slow
def test_fuzz_single_bit_flips_give_a_clean_error_or_the_identical_result(
    real_trace: Path, tmp_path: Path
) -> None:
    import select

    base = real_trace.read_bytes()
    bits = flip_positions(base, n_random=250, n_spec=80)
    assert len(bits) >= 300
    outcomes: dict[int, str] = {}
    budget = time.monotonic() + 300
    per_flip_s = 30
    pending = list(bits)
    baseline = None
    while pending and time.monotonic() < budget:
        worker = subprocess.Popen(
            [sys.executable, "-c", FUZZ_WORKER, str(real_trace), str(tmp_path / "flipped.h5")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write("".join(f"{b}\n" for b in pending))
        worker.stdin.close()
        try:
            while pending:
                ready, _, _ = select.select([worker.stdout], [], [], per_flip_s)
                if not ready:
                    outcomes[pending.pop(0)] = "hang"  # then restart after it
                    break
                line = worker.stdout.readline()
                if not line:
                    outcomes[pending.pop(0)] = f"worker died ({worker.wait()})"
                    break
                key, result = line.rstrip("\n").split(" ", 1)
                if key == "baseline":
                    baseline = result
                    continue
                assert int(key) == pending[0]
                outcomes[pending.pop(0)] = result
        finally:
            worker.kill()
            worker.wait()
    assert baseline is not None and len(baseline) == 64
    bad = {b: o for b, o in outcomes.items() if o not in ("error", baseline)}
    counts = {
        "error": sum(o == "error" for o in outcomes.values()),
        "identical": sum(o == baseline for o in outcomes.values()),
        "other": len(bad),
    }
    assert len(outcomes) >= 300, (len(outcomes), counts)
    assert not bad, (counts, dict(list(bad.items())[:10]))
    # Every flip inside the stored spec text changes it, so each must be an error; and the
    # rest are not all harmless either (headers, checksums, data).
    assert counts["error"] >= 80, counts
    print(f"bit flips: {counts}")


def test_a_stopped_runs_handlers_still_ignore_the_kills_repeats() -> None:
    """After an interrupted run has written its trace, the handlers from before the run come
    back behind a grace handler: the rest of a Slurm/group kill (repeats within the window)
    cannot end the process by the signal instead of its exit status 2; a later signal goes to
    the old handler."""
    from codl.files import REPEAT_IGNORE_S
    from codl.harness import runner

    seen: list[int] = []
    before = signal.getsignal(signal.SIGUSR1)
    try:
        # Not stopped: the old handler comes back as it was.
        stop = runner._StopHandler()
        signal.signal(signal.SIGUSR1, stop)
        stop.restore({signal.SIGUSR1: before})
        assert signal.getsignal(signal.SIGUSR1) == before
        # Stopped just now: a repeat is swallowed, even with the default handler behind.
        stop = runner._StopHandler()
        with pytest.raises(runner.RunInterruptedError, match="SIGUSR1"):
            stop(signal.SIGUSR1, None)
        stop(signal.SIGUSR1, None)  # a repeat inside the window: ignored
        stop.restore({signal.SIGUSR1: signal.SIG_DFL})
        signal.raise_signal(signal.SIGUSR1)  # SIG_DFL would end this process
        # Stopped long ago: the signal is a new one and reaches the old handler.
        stop = runner._StopHandler()
        with pytest.raises(runner.RunInterruptedError):
            stop(signal.SIGUSR1, None)
        assert stop.first is not None
        stop.first -= 2 * REPEAT_IGNORE_S
        stop.restore({signal.SIGUSR1: lambda signum, _frame: seen.append(signum)})
        signal.raise_signal(signal.SIGUSR1)
        assert seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_a_stop_inside_a_workers_descriptor_hand_over_waits_for_its_end(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's tensors come from a loader worker as file descriptors, each fetched over a
    socket with a handshake. A stop raised inside that handshake cut it, and the worker's
    multiprocessing resource sharer printed a BrokenPipeError traceback into the run's stderr
    (CI, 2026-12-04; 1 of 40 kills of the endless run on the 2-core machine). The signal here
    lands exactly there: it must be delivered again after the fetch, the batch must arrive
    whole, and the worker must print nothing."""
    from multiprocessing import connection

    import torch

    from codl.harness import runner

    rank = os.getpid()
    answer = connection.answer_challenge
    sent: list[float] = []

    def signalled(conn: Any, authkey: bytes) -> None:
        # Only in this process, and once: the forked worker runs the server side.
        if os.getpid() == rank and not sent:
            sent.append(time.monotonic())
            os.kill(rank, signal.SIGUSR1)  # its handler runs before the next line
        answer(conn, authkey)

    monkeypatch.setattr(connection, "answer_challenge", signalled)
    samples = torch.arange(8000, dtype=torch.float32).view(4000, 2)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(samples),
        batch_size=2,
        num_workers=1,
        multiprocessing_context="fork",
    )
    # The strategy whose hand-over this is, whatever an earlier test left (runs put theirs back).
    strategy = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_descriptor")
    before = signal.signal(signal.SIGUSR1, runner._StopHandler())
    got: list[torch.Tensor] = []
    batches = iter(loader)
    try:
        with pytest.raises(runner.RunInterruptedError, match="SIGUSR1"):
            for (batch,) in batches:
                got.append(batch)
        stopped = time.monotonic()
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        runner._shutdown_loader(batches)
        time.sleep(5 * runner._HANDOVER_RETRY_S)  # no re-delivery left to reach `before`
        signal.signal(signal.SIGUSR1, before)
        torch.multiprocessing.set_sharing_strategy(strategy)
    assert sent, "no batch was fetched through a handshake"
    assert got and torch.equal(got[0], samples[:2]), "the signalled batch did not arrive whole"
    assert stopped - sent[0] < 2.0, "the stop was not delivered again after the fetch"
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
