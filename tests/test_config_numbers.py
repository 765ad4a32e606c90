"""Every numeric key of the config schema refuses what is not its kind of number (NaN, infinity,
a word, YAML's `yes`, a fraction where an integer is due, a number past its bound), wherever it
is written: one line naming the key path the user wrote and what was expected, never a Python
traceback (issue: bad-input checks).

The keys are walked from the schema itself, so a numeric key added later is covered too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from codl.config import build_plan, load_plan, schema, section_problems
from codl.errors import ConfigError
from codl.spec import RunSpec, field_paths

SCHEMA = schema()
NUMERIC = {"integer", "number"}


def _types(prop: dict[str, Any]) -> set[str]:
    kind = prop.get("type", ())
    return {kind} if isinstance(kind, str) else set(kind)


def _numeric_leaves(node: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    for key, prop in node.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        if "properties" in prop:
            yield from _numeric_leaves(prop, path)
        elif _types(prop) & NUMERIC:
            yield path, prop


RUN_KEYS = dict(_numeric_leaves(SCHEMA["$defs"]["run"]))
# The numeric keys outside the run spec (slurm, blocks, advisor, share, any section added
# later), and experiments[].repeats.
SECTION_KEYS = dict(
    _numeric_leaves(
        {
            "properties": {
                k: v
                for k, v in SCHEMA["properties"].items()
                if k not in ("defaults", "experiments")
            }
        }
    )
)
SECTION_KEYS["experiments.repeats"] = SCHEMA["properties"]["experiments"]["items"]["properties"][
    "repeats"
]
# Arrays of integers (share.advised, share.fixed.<name>): an item of each.
ITEM_KEYS = {
    "share.advised": SCHEMA["properties"]["share"]["properties"]["advised"]["items"],
    "share.fixed.x": SCHEMA["properties"]["share"]["properties"]["fixed"]["additionalProperties"][
        "items"
    ],
}


def _bad_values(prop: dict[str, Any]) -> list[tuple[str, Any]]:
    """(label, value) of what ``prop`` must refuse; the label is the YAML a user would write."""
    out: list[tuple[str, Any]] = [
        (".nan", math.nan),
        (".inf", math.inf),
        ("-.inf", -math.inf),
        ("many", "many"),
        ("yes", True),
        ("[1]", [1]),
        ("{a: 1}", {"a": 1}),
    ]
    if "integer" in _types(prop) and "number" not in _types(prop):
        out += [("2.5", 2.5), ("2.0", 2.0)]
    if "number" in _types(prop):
        out.append(("1e400 as an integer", 10**400))  # past a float: float() overflows
    if "minimum" in prop:
        out.append(("below the minimum", prop["minimum"] - 1))
    out.append(("10**30", 10**30))
    return out


def _unbounded(path: str) -> bool:
    """Keys where 10**30 is no mistake the plan can see: a learning rate has no largest
    meaningful value (past 1.8e308 it is no float, and refused as such)."""
    return path == "workload.lr"


def _cases(keys: dict[str, dict[str, Any]]) -> list[Any]:
    return [
        pytest.param(key, value, id=f"{key}={label}")
        for key, prop in keys.items()
        for label, value in _bad_values(prop)
        if not (label == "10**30" and _unbounded(key))
    ]


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    *parents, last = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return out


def _problems(cfg: dict[str, Any], tmp_path: Path) -> tuple[str, ...]:
    """The problems `codl plan` reports for ``cfg``, read back from YAML as a user writes it."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError) as info:
        load_plan(path)
    return info.value.problems


# One line, naming the key and what was expected: `got X, expected Y`, or jsonschema's bound
# (`-1 is less than the minimum of 0`), which states the expectation.
_CLEAN = (
    r"(got .+, expected .+|.+ is (less|greater) than( or equal to)? the (minimum|maximum) of .+)"
)


def _assert_names(problems: tuple[str, ...], path: str) -> None:
    pattern = re.compile(rf"^{re.escape(path)}(\[\d+\])?: {_CLEAN}$", re.DOTALL)
    assert len(problems) == 1, problems
    assert pattern.match(problems[0]), problems[0]
    assert "Traceback" not in problems[0] and "\n" not in problems[0]


@pytest.mark.parametrize(("key", "value"), _cases(RUN_KEYS))
def test_a_bad_number_in_defaults_names_the_defaults_key(
    key: str, value: Any, tmp_path: Path
) -> None:
    cfg = {"defaults": _nest(key, value), "experiments": [{"name": "e"}, {"name": "f"}]}
    _assert_names(_problems(cfg, tmp_path), f"defaults.{key}")


@pytest.mark.parametrize(("key", "value"), _cases(RUN_KEYS))
def test_a_bad_number_in_base_names_the_base_key(key: str, value: Any, tmp_path: Path) -> None:
    cfg = {"experiments": [{"name": "e", "base": _nest(key, value)}]}
    _assert_names(_problems(cfg, tmp_path), f"experiments[0].base.{key}")


@pytest.mark.parametrize(("key", "value"), _cases(RUN_KEYS))
def test_a_bad_number_in_a_factor_names_the_factor(key: str, value: Any, tmp_path: Path) -> None:
    if key == "repeat":
        pytest.skip("`repeat` is no factor (set by `repeats`)")
    cfg = {"experiments": [{"name": "e", "factors": {key: [value]}}]}
    _assert_names(_problems(cfg, tmp_path), f"experiments[0].factors.{key}")


@pytest.mark.parametrize(("key", "value"), _cases(SECTION_KEYS))
def test_a_bad_number_in_a_section_names_its_key(key: str, value: Any, tmp_path: Path) -> None:
    cfg: dict[str, Any] = {"experiments": [{"name": "e"}]}
    if key == "experiments.repeats":
        cfg["experiments"][0]["repeats"] = value
        path = "experiments[0].repeats"
    else:
        cfg.update(_nest(key, value))
        path = key
    _assert_names(_problems(cfg, tmp_path), path)


@pytest.mark.parametrize(("key", "value"), _cases(ITEM_KEYS))
def test_a_bad_number_in_a_list_names_the_item(key: str, value: Any, tmp_path: Path) -> None:
    cfg: dict[str, Any] = {
        "experiments": [{"name": "a"}, {"name": "b", "base": {"seed": 1}}],
        "share": {"jobs": ["a", "b"]},
    }
    section, *name = key.split(".")[1:]
    counts = [value, 1]
    cfg["share"][section] = {name[0]: counts} if name else counts
    _assert_names(_problems(cfg, tmp_path), f"{key}[0]")


def test_the_walk_found_the_numeric_keys() -> None:
    assert {"loader.workers", "loader.prefetch_factor", "loader.worker_nice"} <= set(RUN_KEYS)
    assert {"runtime.switch_interval_ms", "workload.lr", "seed"} <= set(RUN_KEYS)
    assert {"blocks.seed", "slurm.cpus_per_rank", "advisor.cores", "share.cpus"} <= set(
        SECTION_KEYS
    )
    assert set(RUN_KEYS) <= set(field_paths())


@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "y", "n"])
def test_yaml_booleans_are_named_as_written(word: str, tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"defaults:\n  loader:\n    workers: {word}\nexperiments:\n  - name: e\n")
    with pytest.raises(ConfigError) as info:
        load_plan(path)
    (problem,) = info.value.problems
    assert problem.startswith("defaults.loader.workers: got ")
    assert "expected an integer" in problem


def test_a_good_number_still_plans() -> None:
    plan = build_plan(
        {
            "defaults": {"loader": {"workers": 3}, "runtime": {"switch_interval_ms": 2}},
            "experiments": [{"name": "e", "factors": {"runtime.switch_interval_ms": [0, 0.5, 20]}}],
        }
    )
    assert sorted(s.runtime.switch_interval_ms for s in plan.specs.values()) == [0, 0.5, 20]
    assert {s.loader.workers for s in plan.specs.values()} == {3}
    assert RunSpec.from_dict({"runtime": {"switch_interval_ms": 5}}).runtime.switch_interval_ms == 5


# --- the key a message names -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        # A YAML key that is a number was named as a list index: `[1]`, `defaults[2]`.
        ({1: "x", "experiments": [{"name": "e"}]}, "1: unknown key"),
        ({"defaults": {2: "x"}, "experiments": [{"name": "e"}]}, "defaults.2: unknown key"),
        (
            {"experiments": [{"name": "e", "base": {"loader": {4: 1}}}]},
            "experiments[0].base.loader.4: unknown key",
        ),
        ({"blocks": {3: "x"}, "experiments": [{"name": "e"}]}, "blocks.3: unknown key"),
        # A defaults value the spec refused was named once per experiment, as the experiment's.
        (
            {
                "defaults": {"loader": {"workers": 2000}},
                "experiments": [{"name": "e"}, {"name": "f"}],
            },
            "defaults.loader.workers: 2000 is greater than the maximum of 1024",
        ),
        (
            {
                "defaults": {"workload": {"lr": math.nan}},
                "experiments": [{"name": "e"}, {"name": "f"}],
            },
            "defaults.workload.lr: got nan, expected a finite number > 0",
        ),
        (
            {
                "defaults": {"dataset": {"name": "a b"}},
                "experiments": [{"name": "e"}, {"name": "f"}],
            },
            "defaults.dataset.name: got 'a b', expected letters",
        ),
        # A factor's value was named by the combination it made, and dataset.seed not at all.
        (
            {"experiments": [{"name": "e", "factors": {"dataset.seed": [-1]}}]},
            "experiments[0].factors.dataset.seed: -1 is less than the minimum of 0",
        ),
        # Repeats past the limit named the experiment, not its `repeats`.
        (
            {"experiments": [{"name": "e", "repeats": 10**9}]},
            "experiments[0].repeats: got 1000000000, expected at most 10000",
        ),
    ],
)
def test_each_message_names_the_key_written(cfg: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_plan(cfg, project_dirs=())
    (problem,) = info.value.problems
    assert problem.startswith(expected), problem


def test_every_bad_number_is_listed_at_once(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "defaults:\n"
        "  loader: {workers: .nan, handoff: ring}\n"
        "  runtime: {switch_interval_ms: .inf}\n"
        "blocks: {seed: many}\n"
        "slurm: {cpus_per_rank: yes}\n"
        "experiments:\n"
        "  - name: e\n"
        "    repeats: 2.0\n"
        "  - name: f\n"
        "    base: {loader: {prefetch_factor: 1e3}}\n"
        "    factors: {loader.worker_nice: [0, 20, 19.5]}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_plan(path)
    problems = info.value.problems
    assert [p.split(":")[0] for p in problems] == [
        "blocks.seed",
        "defaults.loader.workers",
        "defaults.runtime.switch_interval_ms",
        "experiments[0].repeats",
        "experiments[1].base.loader.prefetch_factor",
        "slurm.cpus_per_rank",
        "experiments[1].factors.loader.worker_nice",
        "experiments[1].factors.loader.worker_nice",
    ], problems
    assert "got '1e3'" in problems[4]  # YAML 1.1 reads 1e3 (no dot) as a word


@pytest.mark.parametrize("where", ["defaults", "base"])
def test_a_repeat_written_by_hand_is_refused(where: str) -> None:
    run = {"repeat": 3}
    cfg: dict[str, Any] = {"experiments": [{"name": "e", "repeats": 2}]}
    if where == "defaults":
        cfg["defaults"] = run
    else:
        cfg["experiments"][0]["base"] = run
    with pytest.raises(ConfigError) as info:
        build_plan(cfg, project_dirs=())
    key = "defaults.repeat" if where == "defaults" else "experiments[0].base.repeat"
    assert info.value.problems == (
        f"{key}: got 3, expected 0 or no `repeat` (each experiment's `repeats` numbers its "
        "runs 0, 1, ...)",
    )
    # 0, what a spec's to_dict() holds, is let through.
    run["repeat"] = 0
    assert [r.spec.repeat for r in build_plan(cfg, project_dirs=()).runs] == [0, 1]


# --- YAML that Python cannot construct -------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("9" * 5000, "is not an integer codl reads"), ("2024-13-01", "is not a date")],
)
def test_a_value_python_cannot_build_is_a_yaml_error(
    value: str, expected: str, tmp_path: Path
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"experiments:\n  - name: e\n    base:\n      seed: {value}\n")
    with pytest.raises(ConfigError) as info:
        load_plan(path)
    (problem,) = info.value.problems
    assert problem.startswith(f"{path}: YAML error at line 4, column 13: "), problem
    assert expected in problem and len(problem) < 500


# --- the ring hand-off and the interpreter: loader.* and runtime.* ---------------------------


@pytest.mark.parametrize("interval", [1e-9, 0.0005, -0.0, 0, 0.001, 1000, 1000.0001])
def test_a_switch_interval_cpython_cannot_keep_is_refused(interval: float) -> None:
    # CPython keeps whole microseconds: 0.0005 ms would run (and be recorded) as 0.
    good = interval == 0 or 0.001 <= interval <= 1000
    cfg = {"experiments": [{"name": "e", "factors": {"runtime.switch_interval_ms": [interval]}}]}
    spec = {"runtime": {"switch_interval_ms": interval}}
    if good:
        assert build_plan(cfg, project_dirs=()).runs
        assert RunSpec.from_dict(spec).runtime.switch_interval_ms == interval
        return
    with pytest.raises(ConfigError) as info:
        build_plan(cfg, project_dirs=())
    (problem,) = info.value.problems
    assert problem == (
        f"experiments[0].factors.runtime.switch_interval_ms: got {interval!r}, expected 0 or a "
        "finite number from 0.001 to 1000"
    )
    with pytest.raises(ConfigError, match=r"runtime\.switch_interval_ms: got .*CPython keeps"):
        RunSpec.from_dict(spec)


@pytest.mark.parametrize("handoff", ["ring", "torch"])
def test_a_loader_with_no_worker_is_refused_for_either_hand_off(handoff: str) -> None:
    cfg = {
        "experiments": [
            {
                "name": "e",
                "base": {"loader": {"handoff": handoff}},
                "factors": {"mode": ["data", "compute"], "loader.workers": [0, 2]},
            }
        ]
    }
    with pytest.raises(ConfigError) as info:
        build_plan(cfg, project_dirs=())
    (problem,) = info.value.problems
    assert problem.startswith(
        "experiments[0] (e: mode=data, loader.workers=0): loader.workers: got 0 with mode 'data'"
    )


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"workload": {"lr": math.nan}}, "workload.lr: got nan, expected a finite number"),
        ({"workload": {"lr": 10**400}}, "workload.lr: got an integer of about 401 digits"),
        ({"runtime": {"switch_interval_ms": math.inf}}, "runtime.switch_interval_ms: got inf"),
        ({"loader": {"workers": 2.0}}, "loader.workers: got 2.0, expected an integer"),
        ({"loader": {"worker_nice": 20}}, "loader.worker_nice: got 20, expected <= 19"),
        ({"pinning": {"launch_cores": 10**6}}, "pinning.launch_cores: got 1000000, expected <="),
        ({"dataset": {"seed": -1}}, "dataset.seed: got -1, expected an integer >= 0"),
        ({"dataset": {"seed": 2**63}}, "dataset.seed: got 9223372036854775808, expected <="),
    ],
)
def test_a_spec_given_to_codl_run_is_checked_alike(spec: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        RunSpec.from_dict(spec)
    (problem,) = info.value.problems
    assert problem.startswith(expected), problem


# --- sections read before the plan -------------------------------------------------------------


@pytest.mark.parametrize(
    ("advisor", "expected"),
    [
        (3, "advisor: got 3, expected a mapping"),
        ({"cores": math.nan}, "advisor.cores: got nan, expected an integer from 0 to 65536"),
        ({"cores": "many"}, "advisor.cores: got 'many', expected an integer from 0 to 65536"),
        ({"repeats": math.inf}, "advisor.repeats: got inf, expected an integer from 1 to 10000"),
        ({"map": "yes"}, "advisor.map: got 'yes', expected true or false"),
    ],
)
def test_a_section_can_be_checked_before_the_plan(advisor: Any, expected: str) -> None:
    """`codl plan` and the workflow read `advisor` before they plan: its reader checks the
    section with ``section_problems`` before its ``int()``s."""
    cfg = {"advisor": advisor, "experiments": [{"name": "e"}]}
    assert section_problems(cfg, "advisor") == [expected]
    assert section_problems(cfg, "blocks") == []
    with pytest.raises(ConfigError) as info:
        build_plan(cfg, project_dirs=())
    assert info.value.problems == (expected,)
