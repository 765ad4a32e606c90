"""Plans fixed before their runs: `codl plan --freeze` writes a plan and its hash, runs record
the hash, and a result is pre-registered only when git saw the plan before the first run.

The git repositories are real (git init in tmp_path); their commit times and the runs' start
times are set, so that each test says which came first.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from codl import plan_registry as pr
from codl.cli import main
from codl.errors import CodlError, ConfigError

CONFIG: dict[str, Any] = {
    "name": "prereg",
    "defaults": {
        "workload": {"batch_size": 4, "image_size": 32},
        "dataset": {"name": "pr-jpeg", "samples": 16, "height": 32, "width": 32},
        "loader": {"workers": 1},
        "steps": {"warmup": 1, "measured": 2},
    },
    "experiments": [{"name": "e", "factors": {"mode": ["compute", "data+compute"]}, "repeats": 2}],
    "blocks": {"order": "abba"},
    "hypothesis": {"metric": "compute_inflation", "target": "< 1.05"},
}
T0 = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


def _write(path: Path, cfg: dict[str, Any], header: str = "") -> Path:
    path.write_text(header + yaml.safe_dump(cfg, sort_keys=False))
    return path


def _git(repo: Path, *args: str, when: datetime.datetime | None = None) -> None:
    env = dict(os.environ)
    if when is not None:
        stamp = when.isoformat()
        env |= {"GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=repo,
        env=env,
        check=True,
        capture_output=True,
    )


def _commit(repo: Path, path: Path, when: datetime.datetime) -> None:
    _git(repo, "add", str(path.resolve().relative_to(repo.resolve())))
    _git(repo, "commit", "-q", "-m", "freeze", when=when)


def _runs(repo: Path, starts: list[datetime.datetime], blocks: list[str]) -> Path:
    table = repo / "results" / "prereg" / "tables" / "runs.csv"
    table.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(
        {
            "run_id": [f"r{i}" for i in range(len(starts))],
            "start_time": [s.isoformat() for s in starts],
            "block": blocks,
        }
    ).to_csv(table, index=False)
    return table


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # A directory name with a space and non-ASCII letters: paths are handed to git whole.
    root = tmp_path / "pré reg"
    root.mkdir()
    _git(root, "init", "-q")
    monkeypatch.chdir(root)
    return root


def test_freezing_twice_gives_the_same_hash_and_a_change_another(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _write(repo / "prereg.yaml", CONFIG)
    assert main(["plan", str(cfg), "--freeze"]) == 0
    first = capsys.readouterr().out.split()
    path = Path(first[1])
    assert path == Path("results/prereg/plan.frozen.json")
    assert main(["plan", str(cfg), "--freeze"]) == 0
    assert capsys.readouterr().out.split() == first
    frozen = pr.read_frozen(path)
    assert frozen is not None and frozen.sha256 == first[0]
    assert frozen.n_blocks == 2
    assert frozen.content["hypothesis"]["target"] == "< 1.05"
    assert frozen.content["hypothesis"]["unit"] == "invocation"  # the schema's default
    # Comments and key order are not the plan.
    reordered = dict(reversed(list(CONFIG.items())))
    _write(cfg, reordered, header="# a comment\n")
    assert pr.freeze(cfg)[1].sha256 == first[0]
    # Another target, or another block, is another plan.
    _write(cfg, {**CONFIG, "hypothesis": {"target": "< 1.10"}})
    assert pr.freeze(cfg)[1].sha256 != first[0]
    three = {**CONFIG, "experiments": [{**CONFIG["experiments"][0], "repeats": 3}]}
    _write(cfg, three)
    assert pr.freeze(cfg)[1].n_blocks == 3


def test_a_frozen_plan_edited_by_hand_is_refused(repo: Path) -> None:
    cfg = _write(repo / "prereg.yaml", CONFIG)
    path, _ = pr.freeze(cfg)
    body = json.loads(path.read_text())
    body["plan"]["hypothesis"]["target"] = "< 2"
    path.write_text(json.dumps(body))
    with pytest.raises(CodlError, match=r"plan\.frozen\.json: sha256: .* not the hash"):
        pr.read_frozen(path)


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"target": "about 5 %"}, "hypothesis.target"),
        ({"metric": "speed"}, "hypothesis.metric"),
        ({"claim": "x"}, "hypothesis.claim"),
        ({"setting": "isolated-main"}, "hypothesis.setting"),
    ],
)
def test_the_hypothesis_section_is_checked(repo: Path, section: dict[str, str], key: str) -> None:
    cfg = _write(repo / "prereg.yaml", {**CONFIG, "hypothesis": section})
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        pr.freeze(cfg)


def test_the_advisor_predictions_are_frozen_by_their_sha256(repo: Path) -> None:
    predictions = repo / "predictions.csv"
    predictions.write_text("setting,predicted\na,1\n")
    adv = {"advisor": {"predictions": str(predictions)}}
    cfg = _write(repo / "prereg.yaml", {**CONFIG, **adv})
    _, frozen = pr.freeze(cfg)
    import hashlib

    want = hashlib.sha256(predictions.read_bytes()).hexdigest()
    assert frozen.content["predictions"]["sha256"] == want
    predictions.unlink()
    with pytest.raises(CodlError, match=r"advisor\.predictions: .* is not a file"):
        pr.freeze(cfg)


def test_committed_before_the_first_run_is_pre_registered(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _write(repo / "prereg.yaml", CONFIG)
    path, frozen = pr.freeze(cfg)
    _commit(repo, path, T0)
    hour = datetime.timedelta(hours=1)
    _runs(repo, [T0 + hour, T0 + 2 * hour], ["n#0", "n#1"])
    st = pr.status(cfg)
    assert st.registration is pr.Registration.PREREGISTERED
    assert st.label == "pre-registered"
    assert (st.committed_at, st.first_run_at) == (T0, T0 + hour)
    assert st.plan_sha256 == frozen.sha256
    assert main(["plan", str(cfg), "--status"]) == 0
    assert capsys.readouterr().out.startswith(f"pre-registered (plan {frozen.sha256[:12]}")


def test_committed_after_the_first_run_or_never_is_exploratory(repo: Path) -> None:
    cfg = _write(repo / "prereg.yaml", CONFIG)
    assert pr.status(cfg).registration is pr.Registration.EXPLORATORY  # no plan
    path, _ = pr.freeze(cfg)
    _runs(repo, [T0, T0], ["n#0", "n#1"])
    st = pr.status(cfg)
    assert (st.registration, st.reason) == (
        pr.Registration.EXPLORATORY,
        "the frozen plan is not committed to git",
    )
    _commit(repo, path, T0 + datetime.timedelta(minutes=1))
    st = pr.status(cfg)
    assert st.registration is pr.Registration.EXPLORATORY
    assert "after the first run" in st.reason


def test_blocks_added_after_looking_are_named(repo: Path) -> None:
    cfg = _write(repo / "prereg.yaml", CONFIG)
    path, _ = pr.freeze(cfg)
    _commit(repo, path, T0)
    hour = datetime.timedelta(hours=1)
    _runs(repo, [T0 + hour, T0 + hour], ["n#0", "n#1"])
    assert not pr.status(cfg).blocks_added
    # The result looked at, then a third block planned, frozen and committed.
    three = {**CONFIG, "experiments": [{**CONFIG["experiments"][0], "repeats": 3}]}
    _write(cfg, three)
    path, _ = pr.freeze(cfg)
    _commit(repo, path, T0 + 2 * hour)
    _runs(repo, [T0 + hour] * 3, ["n#0", "n#1", "n#2"])
    st = pr.status(cfg)
    assert st.registration is pr.Registration.PREREGISTERED
    assert st.blocks_added
    assert st.label == "pre-registered; blocks added after looking"
    assert (st.plan_blocks, st.analysed_blocks) == (3, 3)


def test_more_blocks_analysed_than_frozen_are_named(repo: Path) -> None:
    cfg = _write(repo / "prereg.yaml", CONFIG)
    path, _ = pr.freeze(cfg)
    _commit(repo, path, T0)
    later = T0 + datetime.timedelta(hours=1)
    _runs(repo, [later] * 3, ["n#0", "n#1", "m#0"])
    st = pr.status(cfg)
    assert st.blocks_added and st.registration is pr.Registration.PREREGISTERED


def test_a_hypothesis_changed_after_the_first_run_is_exploratory(repo: Path) -> None:
    cfg = _write(repo / "prereg.yaml", CONFIG)
    path, _ = pr.freeze(cfg)
    _commit(repo, path, T0)
    _runs(repo, [T0 + datetime.timedelta(hours=1)] * 2, ["n#0", "n#1"])
    _write(cfg, {**CONFIG, "hypothesis": {"target": "< 1.10"}})
    path, _ = pr.freeze(cfg)
    _commit(repo, path, T0 + datetime.timedelta(hours=2))
    st = pr.status(cfg)
    assert st.registration is pr.Registration.EXPLORATORY
    assert st.reason.startswith("hypothesis changed after the first run")


def test_a_run_records_the_hash_the_workflow_hands_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from codl.harness import runner
    from codl.spec import RunSpec
    from codl.trace.clock import now_ns, take_anchor

    monkeypatch.setenv(pr.PLAN_ENV, "ab" * 32)
    attrs = runner._block_attrs(RunSpec(), take_anchor(), now_ns())
    assert attrs[pr.PLAN_ATTR] == "ab" * 32
    monkeypatch.delenv(pr.PLAN_ENV)
    assert runner._block_attrs(RunSpec(), take_anchor(), now_ns())[pr.PLAN_ATTR] == ""


def test_the_workflow_hands_runs_the_frozen_plans_hash(repo: Path) -> None:
    cfg = _write(repo / "prereg.yaml", CONFIG)
    from codl.paths import ResultPaths

    assert pr.recorded_hash(ResultPaths(set_name="prereg").frozen_plan) == ""
    _, frozen = pr.freeze(cfg)
    assert pr.recorded_hash(ResultPaths(set_name="prereg").frozen_plan) == frozen.sha256
    common = Path(__file__).parents[1] / "workflow" / "rules" / "common.smk"
    assert "os.environ[PLAN_ENV] = recorded_hash(PATHS.frozen_plan)" in common.read_text()


def test_the_schema_and_the_hypothesis_agree() -> None:
    schema = yaml.safe_load(
        (Path(pr.__file__).parent / "schemas" / "config.schema.yaml").read_text()
    )
    props = schema["properties"]["hypothesis"]["properties"]
    assert {k: p["default"] for k, p in props.items()} == pr.Hypothesis().to_dict()
    for key, enum in (("metric", pr.Metric), ("statistic", pr.Statistic), ("unit", pr.Unit)):
        assert props[key]["enum"] == [e.value for e in enum]
