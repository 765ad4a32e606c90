"""Issue 37, class 4: rules the config schema states are checked, by ``codl plan`` (and so by
the workflow) before anything runs, every problem in one report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from codl.cli import main
from codl.config import build_plan, load_yaml
from codl.errors import CodlError, ConfigError
from codl.spec import MAX_SEED, RunSpec

REPO = Path(__file__).resolve().parents[1]
SHARE = REPO / "config" / "share-cpu.yaml"


def share_cfg(**share: Any) -> dict[str, Any]:
    cfg = load_yaml(SHARE)
    cfg["share"] = {**cfg["share"], **share}
    return cfg


@pytest.mark.parametrize(
    ("share", "expected"),
    [
        ({"jobs": ["job-light", "job-light"]}, "share.jobs"),
        ({"jobs": ["job-light", "nope"]}, "'nope' is not an experiment"),
        ({"jobs": ["job-light"]}, "expected >= 2 jobs"),
        ({"advised": [1, 1], "advise_from": ["a", "b"]}, "expected one of them"),
        ({"fixed": {"small\n": [1, 1]}}, "share.fixed"),
        ({"fixed": {"x": [1, 1, 1]}}, "expected one entry per job"),
        ({"repeats": 10**9}, "share.repeats"),
        ({"cpus": 10**12}, "share.cpus"),
        ({"advised": [10**12, 1]}, "share.advised"),
    ],
)
def test_plan_refuses_a_share_section_that_breaks_its_rules(
    share: dict[str, Any], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = share_cfg(**share)
    with pytest.raises(ConfigError, match=expected):
        build_plan(cfg)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["plan", str(path)]) == 2
    assert expected.split("'", maxsplit=1)[0] in capsys.readouterr().err


def test_every_share_problem_is_reported_at_once() -> None:
    cfg = share_cfg(jobs=["job-light", "job-light", "nope"], advised=[1], advise_from=["a"])
    with pytest.raises(ConfigError) as exc:
        build_plan(cfg)
    text = exc.value.one_line()
    for fragment in ("more than once", "'nope' is not", "expected one of them", "one entry"):
        assert fragment in text, text


def test_a_good_share_section_still_plans() -> None:
    assert build_plan(load_yaml(SHARE)).runs


@pytest.mark.parametrize("argv0", ["write-spec", "run"])
def test_a_spec_with_a_duplicate_key_is_refused(
    argv0: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = '{"mode": "compute", "seed": 1, "steps": {"measured": 2, "measured": 3}, "seed": 2}'
    if argv0 == "run":
        spec = tmp_path / "spec.json"
        spec.write_text(text)
        argv = ["run", str(spec)]
    else:
        argv = ["write-spec", text, "--out", str(tmp_path / "s.json")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "duplicate key 'seed'" in err and "duplicate key 'measured'" in err
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("seed", [MAX_SEED + 1, 2**64, 2**200])
def test_a_seed_that_run_cannot_use_is_refused_by_the_plan(seed: int) -> None:
    with pytest.raises(CodlError, match="seed"):
        RunSpec.from_dict({"mode": "compute", "seed": seed})
    cfg = {"experiments": [{"name": "e", "base": {"mode": "compute", "seed": seed}}]}
    with pytest.raises(ConfigError, match="seed"):
        build_plan(cfg, project_dirs=())
    assert RunSpec.from_dict({"mode": "compute", "seed": MAX_SEED}).seed == MAX_SEED
    json.dumps(seed)  # what a spec file would hold
