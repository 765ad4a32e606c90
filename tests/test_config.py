"""Config loading, validation (every mistake named by its key path) and expansion into runs."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from codl.config import build_plan, load_plan, load_yaml, schema_problems
from codl.errors import ConfigError
from codl.spec import DatasetSpec, Mode, Policy, RunSpec

REPO = Path(__file__).resolve().parents[1]


def one(**experiment: Any) -> dict[str, Any]:
    """A config of one experiment named `e`."""
    return {"experiments": [{"name": "e", **experiment}]}


def write(tmp_path: Path, content: dict[str, Any] | list[Any] | str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


# --- expansion --------------------------------------------------------------------------------


def test_cartesian_product_times_repeats() -> None:
    modes = ["data", "compute", "combined"]
    policies = ["none", "shared", "isolated", "spread"]
    plan = build_plan(one(factors={"mode": modes, "pinning.policy": policies}, repeats=3))
    assert len(plan.runs) == len(modes) * len(policies) * 3
    assert len(plan.run_ids) == len(plan.runs)  # every combination is a different run
    combos = {(r.spec.mode.value, r.spec.pinning.policy.value) for r in plan.runs}
    assert combos == set(itertools.product(modes, policies))
    for combo in combos:
        repeats = sorted(
            r.spec.repeat
            for r in plan.runs
            if (r.spec.mode.value, r.spec.pinning.policy.value) == combo
        )
        assert repeats == [0, 1, 2]


def test_no_factors_gives_one_run_per_repeat() -> None:
    plan = build_plan(one(repeats=2))
    assert [r.spec for r in plan.runs] == [RunSpec(), RunSpec(repeat=1)]


def test_factor_overrides_base_overrides_defaults_overrides_dataclass() -> None:
    cfg = {
        "defaults": {"loader": {"workers": 2, "prefetch_factor": 3}, "steps": {"measured": 5}},
        "experiments": [
            {
                "name": "e",
                "base": {"loader": {"workers": 3}, "steps": {"warmup": 1}},
                "factors": {"loader.workers": [5], "layout.bucket_cap_mb": [7]},
            },
            {"name": "f", "base": {"loader": {"workers": 3}}},
        ],
    }
    e, f = (r.spec for r in build_plan(cfg).runs)
    assert e.loader.workers == 5  # factor over base
    assert f.loader.workers == 3  # base over defaults
    assert (
        e.loader.prefetch_factor == f.loader.prefetch_factor == 3
    )  # defaults merged, not replaced
    assert e.steps.measured == 5 and e.steps.warmup == 1  # sibling keys of one section merge
    assert f.steps.warmup == RunSpec().steps.warmup  # dataclass default
    assert e.layout.bucket_cap_mb == 7 and e.layout.nodes == RunSpec().layout.nodes
    assert e.loader.pin_memory is RunSpec().loader.pin_memory


def test_runs_that_differ_only_in_unused_fields_are_one_run() -> None:
    plan = build_plan(one(factors={"mode": ["compute", "data"], "loader.workers": [2, 4]}))
    assert len(plan.runs) == 4
    # compute never starts the loader: both worker counts are the same run.
    assert len(plan.run_ids) == 3
    assert len(plan.experiments()["e"]) == 3
    assert sorted(s.mode.value for s in plan.specs.values()) == ["compute", "data", "data"]


def test_identical_runs_are_shared_between_experiments() -> None:
    cfg = {
        "experiments": [
            {"name": "a", "factors": {"mode": ["data", "compute"]}},
            {"name": "b", "factors": {"mode": ["compute", "combined"]}},
        ]
    }
    plan = build_plan(cfg)
    assert len(plan.runs) == 4
    assert len(plan.run_ids) == 3
    exps = plan.experiments()
    assert list(exps) == ["a", "b"]
    shared = set(exps["a"]) & set(exps["b"])
    assert len(shared) == 1
    assert plan.specs[shared.pop()].mode is Mode.COMPUTE
    assert set(plan.run_ids) == set(exps["a"]) | set(exps["b"])


def test_plan_specs_are_normalized_and_keyed_by_run_id() -> None:
    plan = build_plan(one(factors={"mode": ["compute"]}, base={"loader": {"workers": 7}}))
    ((run_id, spec),) = plan.specs.items()
    assert spec.run_id == run_id
    assert spec.loader == RunSpec().loader


def test_datasets_lists_only_data_sets_that_are_read() -> None:
    assert (
        build_plan(
            one(factors={"mode": ["compute", "comm"]}, base={"layout": {"ranks_per_node": 2}})
        ).datasets()
        == {}
    )
    cfg = {
        "tiers": {"shm": "/dev/shm/codl"},
        "experiments": [
            {"name": "a", "base": {"mode": "data", "dataset": {"name": "x", "samples": 16}}},
            {
                "name": "b",
                "base": {"mode": "combined", "dataset": {"name": "x", "samples": 16}},
                "factors": {"dataset.tier": ["default", "shm"]},
            },
            {"name": "c", "base": {"mode": "compute", "dataset": {"name": "unread"}}},
        ],
    }
    plan = build_plan(cfg)
    assert plan.tiers == {"shm": "/dev/shm/codl"}
    assert plan.datasets() == {
        ("x", "default"): DatasetSpec(name="x", samples=16),
        ("x", "shm"): DatasetSpec(name="x", samples=16, tier="shm"),
    }


def test_experiment_order_and_run_order_follow_the_config() -> None:
    plan = build_plan(
        {
            "experiments": [
                {"name": "z", "factors": {"pinning.policy": ["spread", "none"]}},
                {"name": "a"},
            ]
        }
    )
    assert list(plan.experiments()) == ["z", "a"]
    assert [r.spec.pinning.policy for r in plan.runs[:2]] == [Policy.SPREAD, Policy.NONE]


# --- the shipped configs ----------------------------------------------------------------------


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _expected_counts(cfg: dict[str, Any]) -> tuple[int, int]:
    """(runs, distinct runs) derived from the factor lists.

    A combination whose mode does not load data ignores its `loader.*` and `dataset.*` factors,
    so those factors' values collapse into one run; a combination that two experiments share
    (same base and factor values) is one run too.
    """
    runs = 0
    seen: set[tuple[Any, ...]] = set()
    for exp in cfg["experiments"]:
        factors = exp.get("factors", {})
        repeats = exp.get("repeats", 1)
        base = {**_flatten(cfg.get("defaults", {})), **_flatten(exp.get("base", {}))}
        runs += math.prod(len(v) for v in factors.values()) * repeats
        keys = list(factors)
        for combo in itertools.product(*factors.values()):
            values = {**base, **dict(zip(keys, combo, strict=True))}
            mode = Mode(values.get("mode", "combined"))
            if not mode.loads:
                values = {
                    k: v for k, v in values.items() if not k.startswith(("loader.", "dataset."))
                }
            for rep in range(repeats):
                seen.add((*sorted(values.items()), rep))
    return runs, len(seen)


@pytest.mark.parametrize(
    ("name", "dataset"), [("smoke.yaml", "smoke-jpeg"), ("config.yaml", "imagenet-like")]
)
def test_shipped_configs_load(name: str, dataset: str) -> None:
    path = REPO / "config" / name
    cfg = load_yaml(path)
    assert schema_problems(cfg) == []
    plan = load_plan(path)
    runs, distinct = _expected_counts(cfg)
    assert len(plan.runs) == runs
    assert len(plan.run_ids) == distinct
    assert list(plan.experiments()) == [e["name"] for e in cfg["experiments"]]
    assert {name for name, _ in plan.datasets()} == {dataset}


def test_shipped_config_counts_by_hand() -> None:
    # The derivation above, spelled out once for the paper config: `policies` is
    # 2 modes x 4 policies x 3 repeats = 24 runs; `loader` is 2 modes x 3 repeats = 6;
    # `launch_latency` is 2 modes x 2 policies x 2 repeats = 8, all distinct from `policies`
    # (cuda_api is part of the spec).
    plan = load_plan(REPO / "config" / "config.yaml")
    assert len(plan.runs) == 24 + 6 + 8
    assert len(plan.run_ids) == 24 + 6 + 8
    # smoke: 4 modes x 3 policies, no collapse (no loader factor), plus compute+comm and
    # combined on 2 gloo ranks (the decomposition's peer wait).
    assert len(load_plan(REPO / "config" / "smoke.yaml").run_ids) == 4 * 3 + 2


# --- bad configs (issue 10): every mistake fails at plan time, naming the key ---------------

DUPLICATE_KEY_YAML = """
defaults:
  loader:
    workers: 4
  loader:
    pin_memory: true
experiments:
  - name: e
"""

BAD_CONFIGS: list[tuple[str, Any, list[str]]] = [
    (
        "unknown top-level key",
        {"experiments": [{"name": "e"}], "experimets": []},
        ["experimets: unknown key", "did you mean 'experiments'"],
    ),
    (
        "unknown nested key",
        {"defaults": {"loader": {"wrkers": 2}}, "experiments": [{"name": "e"}]},
        ["defaults.loader.wrkers: unknown key", "did you mean 'workers'"],
    ),
    (
        "unknown key in base",
        one(base={"steps": {"measure": 2}}),
        ["experiments[0].base.steps.measure: unknown key", "'measured'"],
    ),
    (
        "misspelled mode in defaults",
        {"defaults": {"mode": "combind"}, "experiments": [{"name": "e"}]},
        ["defaults.mode: got 'combind'", "did you mean 'combined'"],
    ),
    (
        "misspelled mode in a factor",
        one(factors={"mode": ["data", "combind"]}),
        ["experiments[0].factors.mode: got 'combind'", "did you mean 'combined'"],
    ),
    (
        "misspelled policy",
        one(factors={"pinning.policy": ["isolatd"]}),
        ["pinning.policy: got 'isolatd'", "did you mean 'isolated'"],
    ),
    (
        "negative workers in base",
        one(base={"loader": {"workers": -1}}),
        ["experiments[0].base.loader.workers", "-1"],
    ),
    (
        "negative workers in a factor",
        one(factors={"loader.workers": [2, -1]}),
        ["experiments[0].factors.loader.workers: -1 is less than the minimum of 0"],
    ),
    ("zero measured steps", one(base={"steps": {"measured": 0}}), ["steps.measured", "0 is less"]),
    ("string where an integer is due", one(base={"seed": "1"}), ["base.seed", "'1'"]),
    ("YAML syntax error", "experiments:\n  - name: [e\n", ["YAML error at line", "column"]),
    ("duplicate YAML key", DUPLICATE_KEY_YAML, ["duplicate key 'loader'", "line 3"]),
    ("empty file", "", ["file is empty"]),
    ("comments only", "# nothing\n", ["file is empty"]),
    ("YAML list", "- name: e\n", ["got a list, expected a mapping"]),
    ("YAML scalar", "experiments\n", ["got a str, expected a mapping"]),
    ("no experiments key", {"defaults": {}}, ["experiments: missing"]),
    ("empty experiments", {"experiments": []}, ["experiments: [] should be non-empty"]),
    (
        "NCCL on CPU",
        one(base={"layout": {"backend": "nccl"}}),
        ["layout.backend: got 'nccl'", "'cpu'"],
    ),
    ("comm with one rank", one(base={"mode": "comm"}), ["mode: 'comm' needs >= 2 ranks"]),
    (
        "compute+comm with one rank",
        one(factors={"mode": ["compute+comm"]}),
        ["mode: 'compute+comm' needs >= 2 ranks"],
    ),
    (
        "experiment name with space",
        {"experiments": [{"name": "a b"}]},
        ["experiments[0].name", "'a b'"],
    ),
    (
        "experiment name ../x",
        {"experiments": [{"name": "../x"}]},
        ["experiments[0].name", "'../x'"],
    ),
    ("experiment without name", {"experiments": [{"base": {}}]}, ["experiments[0]", "'name'"]),
    ("unsafe dataset name", one(base={"dataset": {"name": "../d"}}), ["dataset.name: got '../d'"]),
    (
        "unsafe tier name",
        {"tiers": {"a b": "/tmp"}, "experiments": [{"name": "e"}]},
        ["tiers.a b: invalid key name"],
    ),
    (
        "duplicate experiment names",
        {"experiments": [{"name": "e"}, {"name": "e"}]},
        ["experiments[1].name: duplicate experiment name 'e'"],
    ),
    (
        "unknown factor key",
        one(factors={"loader.wrkers": [1, 2]}),
        ["experiments[0].factors.loader.wrkers: unknown factor", "did you mean 'loader.workers'"],
    ),
    ("malformed factor key", one(factors={"Mode": ["data"]}), ["experiments[0].factors.Mode"]),
    ("repeat as a factor", one(factors={"repeat": [0, 1]}), ["factors.repeat", "`repeats`"]),
    ("factor with empty list", one(factors={"mode": []}), ["experiments[0].factors.mode", "[]"]),
    ("zero repeats", one(repeats=0), ["experiments[0].repeats", "0"]),
    (
        "unknown workload model",
        one(base={"workload": {"model": "resnet51"}}),
        ["workload.model: got 'resnet51'", "resnet50"],
    ),
    (
        "cosmoflow reading a JPEG set",
        one(base={"workload": {"model": "cosmoflow"}}),
        ["dataset.kind: got 'jpeg'", "'cosmoflow' reads 'volume'"],
    ),
    (
        "data+sleep without warm-up",
        one(base={"mode": "data+sleep", "steps": {"warmup": 0}}),
        ["steps.warmup: got 0 with mode 'data+sleep'"],
    ),
    ("unknown tier", one(base={"dataset": {"tier": "shm"}}), ["dataset.tier: got 'shm'"]),
    (
        "unknown trace codec",
        one(base={"trace": {"compression": "zstd"}}),
        ["trace.compression: got 'zstd'", "blosc-lz4"],
    ),
    (
        "CUPTI on CPU",
        one(base={"trace": {"cupti": True}}),
        ["trace.cupti: true needs device 'cuda'"],
    ),
    (
        "no workers with a loading mode",
        one(factors={"mode": ["data"], "loader.workers": [0]}),
        ["loader.workers: got 0 with mode 'data'"],
    ),
    (
        "more data set classes than model outputs",
        one(base={"dataset": {"classes": 20}}),
        ["dataset.classes: got 20", "workload.classes (10)"],
    ),
    (
        "one data set name, two definitions",
        {
            "experiments": [
                {"name": "a", "base": {"dataset": {"name": "d"}}},
                {"name": "b", "base": {"dataset": {"name": "d", "samples": 70}}},
            ]
        },
        ["dataset.name 'd' is defined with different parameters", "samples: 256 vs 70"],
    ),
    ("missing config file", None, ["no such config file"]),
]


@pytest.mark.parametrize(
    ("content", "expected"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_bad_config_fails_at_plan_time(tmp_path: Path, content: Any, expected: list[str]) -> None:
    path = tmp_path / "missing.yaml" if content is None else write(tmp_path, content)
    with pytest.raises(ConfigError) as info:
        load_plan(path)
    err = info.value
    message = str(err)
    assert err.source == str(path)
    assert str(path) in message
    for fragment in expected:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert err.problems and message.count("\n  - ") == len(err.problems)


def test_bad_config_suite_is_large_and_distinct() -> None:
    names = [c[0] for c in BAD_CONFIGS]
    assert len(set(names)) == len(names) >= 15


@pytest.mark.parametrize("where", ["dir with space", "ünïcødé", "a'quote"])
def test_config_path_with_awkward_characters(tmp_path: Path, where: str) -> None:
    folder = tmp_path / where
    folder.mkdir()
    assert len(load_plan(write(folder, one())).runs) == 1
    with pytest.raises(ConfigError, match="no such config file"):
        load_plan(folder / "nope.yaml")


def test_every_mistake_is_reported_at_once(tmp_path: Path) -> None:
    cfg = {
        "experimets": [],  # 1: unknown top-level key
        "experiments": [
            {"name": "a", "base": {"loader": {"wrkers": 2}}},  # 2: unknown nested key
            {"name": "b", "base": {"layout": {"backend": "nccl"}}},  # 3: NCCL on CPU
            {
                "name": "c",
                # 4: unknown model; reported for `none` only, as `isolatd` fails first
                "base": {"workload": {"model": "resnet51"}},
                "factors": {"pinning.policy": ["none", "isolatd"]},  # 5: misspelled policy
            },
            {"name": "c"},  # 6: duplicate name
            {"name": "d", "factors": {"loader.wrkers": [1]}},  # 7: unknown factor
            {"name": "e", "base": {"mode": "comm", "trace": {"cupti": True}}},  # 8, 9
        ],
    }
    with pytest.raises(ConfigError) as info:
        load_plan(write(tmp_path, cfg))
    problems = info.value.problems
    message = str(info.value)
    assert message.startswith(f"{len(problems)} problem(s) in ")
    assert len(problems) == 9, "\n".join(problems)
    assert message.count("\n  - ") == 9
    for fragment in [
        "experimets: unknown key",
        "experiments[0].base.loader.wrkers",
        "experiments[1] (b): layout.backend",
        "experiments[2] (c: pinning.policy=none): workload.model",
        "experiments[2].factors.pinning.policy: got 'isolatd'",
        "experiments[3].name: duplicate",
        "experiments[4].factors.loader.wrkers",
        "experiments[5] (e): mode: 'comm' needs >= 2 ranks",
        "experiments[5] (e): trace.cupti",
    ]:
        assert fragment in message, f"{fragment!r} not in:\n{message}"


def test_a_mistake_in_base_is_reported_once_not_per_combination() -> None:
    factors = {"mode": ["data", "combined"], "pinning.policy": ["none", "shared", "isolated"]}
    cfg = one(base={"layout": {"backend": "nccl"}}, factors=factors, repeats=2)
    with pytest.raises(ConfigError) as info:
        build_plan(cfg)
    assert info.value.problems == (
        "experiments[0] (e, every combination): layout.backend: got 'nccl' with device 'cpu', "
        "expected 'gloo' on CPU",
    )
    # A mistake of the key alone is the schema's: named where it was written.
    with pytest.raises(ConfigError) as info:
        build_plan(one(base={"dataset": {"name": "bad name"}}, factors=factors, repeats=2))
    assert info.value.problems == (
        "experiments[0].base.dataset.name: got 'bad name', expected letters, digits, '_', '.', "
        "'-', starting with a letter or digit (it becomes a path)",
    )


def test_a_mistake_in_some_combinations_names_each() -> None:
    cfg = one(factors={"mode": ["data", "compute"], "loader.workers": [0, 2]})
    with pytest.raises(ConfigError) as info:
        build_plan(cfg)
    # Only data with 0 workers is wrong; compute ignores the loader.
    (problem,) = info.value.problems
    assert problem.startswith("experiments[0] (e: mode=data, loader.workers=0): loader.workers")
