"""Run-spec identity, serialisation, and consistency of the dataclasses with the config schema."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import random
import re
from typing import Any

import pytest

from codl.config import schema
from codl.errors import CodlError, ConfigError
from codl.spec import (
    MAX_SEED,
    MAX_SWITCH_INTERVAL_MS,
    MIN_SWITCH_INTERVAL_MS,
    UPPER_LIMITS,
    Backend,
    DeviceKind,
    Mode,
    PinningSpec,
    Policy,
    RunSpec,
    TraceCompression,
    field_paths,
    is_safe_name,
    loads_json,
)

# Leaves that normalized() resets when the mode does not load data.
LOADING_ONLY = ("loader.", "dataset.")
# Leaves valid only with another leaf set: the base spec gets it, so only the leaf differs.
PREREQUISITES: dict[str, dict[str, Any]] = {
    "trace.cuda_api_sched": {"trace.cuda_api": True},
    "loader.copy_ahead": {"loader.handoff": "ring"},
}


def _base(path: str, **kwargs: Any) -> RunSpec:
    data = RunSpec(**kwargs).to_dict()
    for leaf, value in PREREQUISITES.get(path, {}).items():
        _set(data, leaf, value)
    return RunSpec.from_dict(data)


def _get(d: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        d = d[part]
    return d


def _set(d: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        d = d[part]
    d[leaf] = value


def _alternatives(value: Any) -> list[Any]:
    """Candidate replacement values of a leaf, tried in order until one is valid."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1, value + 2]
    if isinstance(value, float):
        # value + 1.0 for a leaf whose default is 0.0 (runtime.switch_interval_ms)
        return [value + 1.0] if value == 0 else [value * 2, value / 2]
    if value == "auto":  # pinning.launch_cores
        return [2, 3]
    if isinstance(value, str):
        return ["other-name", "resnet18", "volume"]
    raise TypeError(value)  # pragma: no cover


def _with_changed_leaf(spec: RunSpec, path: str) -> RunSpec:
    """``spec`` with the leaf at ``path`` set to a different value that is still valid."""
    data = spec.to_dict()
    current = _get(data, path)
    enum_values = _enum_values(path)
    candidates = [v for v in enum_values if v != current] if enum_values else _alternatives(current)
    for candidate in candidates:
        _set(data, path, candidate)
        try:
            changed = RunSpec.from_dict(data)
        except ConfigError:
            continue
        assert _get(changed.to_dict(), path) != current
        return changed
    pytest.fail(f"no valid alternative value for {path} (tried {candidates})")


def _enum_values(path: str) -> list[str]:
    """All values of the leaf's enum, or [] when the leaf is not an enum."""
    value: Any = RunSpec()
    for part in path.split("."):
        value = getattr(value, part)
    return [m.value for m in type(value)] if isinstance(value, enum.Enum) else []


def _reordered(value: Any, rng: random.Random) -> Any:
    """The same mapping with keys in a shuffled order at every level."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _reordered(v, rng) for k, v in items}
    return value


# A spec with every section away from its defaults, valid, and loading data.
CUSTOM = {
    "repeat": 2,
    "mode": "data+compute",
    "device": "cuda",
    "workload": {"model": "resnet18", "batch_size": 32, "precision": "bf16", "lr": 0.1},
    "dataset": {"name": "my-set", "samples": 64, "classes": 5, "tier": "shm"},
    "loader": {"workers": 4, "pin_memory": True},
    "pinning": {"policy": "isolated", "launch_cores": 2},
    "layout": {"ranks_per_node": 2, "backend": "nccl"},
    "steps": {"warmup": 3, "measured": 20},
    "trace": {"cupti": True, "cupti_steps": 4, "sched": False},
    "seed": 7,
}


# --- identity ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_run_id_is_independent_of_key_order(seed: int) -> None:
    spec = RunSpec.from_dict(CUSTOM)
    shuffled = _reordered(CUSTOM, random.Random(seed))
    assert RunSpec.from_dict(shuffled).run_id == spec.run_id
    full = _reordered(spec.to_dict(), random.Random(seed))
    assert RunSpec.from_dict(full).run_id == spec.run_id


def _reversed(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reversed(v) for k, v in reversed(value.items())}
    return value


def test_run_id_with_every_level_reversed() -> None:
    flipped = _reversed(CUSTOM)
    assert list(flipped) == list(reversed(CUSTOM))
    assert list(flipped["workload"]) == list(reversed(CUSTOM["workload"]))
    assert RunSpec.from_dict(flipped).run_id == RunSpec.from_dict(CUSTOM).run_id
    assert RunSpec.from_dict(flipped).canonical_json() == RunSpec.from_dict(CUSTOM).canonical_json()


def test_run_id_fills_defaults() -> None:
    assert RunSpec.from_dict({}).run_id == RunSpec().run_id
    assert RunSpec.from_dict({"loader": {}}).run_id == RunSpec().run_id
    assert RunSpec.from_dict({"loader": {"workers": 2}}).run_id == RunSpec().run_id


def test_run_id_format() -> None:
    for spec in (RunSpec(), RunSpec.from_dict(CUSTOM)):
        assert re.fullmatch(r"[0-9a-f]{12}", spec.run_id)
        assert spec.run_id == hashlib.sha256(spec.canonical_json().encode()).hexdigest()[:12]


# Policy `none` reads no other pinning key, so the bases pin: every pinning leaf then counts.
PINNED = PinningSpec(policy=Policy.ISOLATED)


@pytest.mark.parametrize("path", field_paths())
def test_every_leaf_changes_the_id_of_a_combined_run(path: str) -> None:
    base = _base(path, device=DeviceKind.CUDA, pinning=PINNED)
    assert base.mode is Mode.COMBINED
    changed = _with_changed_leaf(base, path)
    assert changed.run_id != base.run_id, path


@pytest.mark.parametrize("path", field_paths())
def test_loader_and_dataset_leaves_do_not_change_the_id_of_a_compute_run(path: str) -> None:
    base = _base(path, mode=Mode.COMPUTE, device=DeviceKind.CUDA, pinning=PINNED)
    changed = _with_changed_leaf(base, path)
    if path.startswith(LOADING_ONLY):
        assert changed.run_id == base.run_id, path
        assert changed.normalized() == base.normalized()
    else:
        assert changed.run_id != base.run_id, path


def test_normalized_resets_only_for_modes_that_do_not_load() -> None:
    custom = RunSpec.from_dict(CUSTOM)
    for mode in Mode:
        spec = dataclasses.replace(custom, mode=mode)
        norm = spec.normalized()
        if mode.loads:
            assert norm == spec
        else:
            assert norm.loader == RunSpec().loader
            assert norm.dataset == RunSpec().dataset
            assert norm.pinning == spec.pinning and norm.workload == spec.workload


# --- serialisation ----------------------------------------------------------------------------


def test_to_dict_from_dict_round_trip() -> None:
    for spec in (RunSpec(), RunSpec.from_dict(CUSTOM)):
        data = spec.to_dict()
        assert RunSpec.from_dict(data) == spec
        assert RunSpec.from_dict(json.loads(json.dumps(data))) == spec
        assert sorted(_leaves(data)) == sorted(field_paths())


def _leaves(d: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else k
        out.extend(_leaves(v, key) if isinstance(v, dict) else [key])
    return out


def test_canonical_json_is_sorted_and_compact() -> None:
    spec = RunSpec.from_dict(CUSTOM)
    text = spec.canonical_json()
    key_orders: list[list[str]] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        key_orders.append([k for k, _ in pairs])
        return dict(pairs)

    parsed = json.loads(text, object_pairs_hook=hook)
    expected = spec.normalized().to_dict()
    del expected["trace"]["cuda_api"]  # at its default: left out (ids of earlier runs hold)
    for role in ("autograd", "pin_memory", "comm"):  # likewise
        del expected["pinning"][role]
    del expected["trace"]["cuda_api_sched"]  # likewise
    del expected["trace"]["sched_events"]  # likewise
    del expected["trace"]["compression"]  # likewise
    del expected["dataset"]["cost"]  # likewise
    del expected["pinning"]["cpus"]  # likewise
    del expected["loader"]["sharing_strategy"]  # likewise
    del expected["loader"]["handoff"]  # likewise
    del expected["loader"]["worker_nice"]  # likewise
    del expected["loader"]["copy_ahead"]  # likewise
    del expected["workload"]["seq_len"]  # likewise
    del expected["dataset"]["generator"]  # likewise
    del expected["runtime"]  # a group whose every key is at its default: left out whole
    assert parsed == expected
    assert len(key_orders) == sum(
        1 for f in dataclasses.fields(RunSpec) if dataclasses.is_dataclass(f.default_factory)
    )
    assert all(keys == sorted(keys) for keys in key_orders)
    assert "\n" not in text and ", " not in text and ": " not in text
    assert all(isinstance(v, str | int | float | bool) for v in _leaf_values(parsed))


def _leaf_values(d: dict[str, Any]) -> list[Any]:
    out = []
    for v in d.values():
        out.extend(_leaf_values(v) if isinstance(v, dict) else [v])
    return out


def test_from_dict_reports_every_problem_with_its_path() -> None:
    with pytest.raises(ConfigError) as info:
        RunSpec.from_dict(
            {"mode": "combind", "loader": {"wrkers": 2, "pin_memory": "yes"}, "seed": "1"}
        )
    problems = info.value.problems
    assert len(problems) == 4, problems
    text = "\n".join(problems)
    assert "mode: got 'combind'" in text and "did you mean 'combined'" in text
    assert "loader.wrkers: unknown key" in text and "did you mean 'workers'" in text
    assert "loader.pin_memory: got 'yes', expected true or false" in text
    assert "seed: got '1', expected an integer" in text


def test_cupti_steps_is_only_checked_when_cupti_is_on() -> None:
    RunSpec.from_dict({"steps": {"measured": 1}})  # default cupti_steps 2, CUPTI off: fine
    with pytest.raises(ConfigError, match=r"trace\.cupti_steps: got 2, expected <= steps"):
        RunSpec.from_dict({"device": "cuda", "steps": {"measured": 1}, "trace": {"cupti": True}})


@pytest.mark.parametrize(
    ("name", "safe"),
    [
        ("smoke-jpeg", True),
        ("a.b_c-1", True),
        ("a b", False),
        ("../x", False),
        (".hidden", False),
        ("a/b", False),
        ("", False),
        ("é", False),
        ("x" * 64, True),
        ("x" * 65, False),
    ],
)
def test_is_safe_name(name: str, safe: bool) -> None:
    assert is_safe_name(name) is safe


# --- schema consistency (golden: catches drift between dataclasses and schema) ----------------


def _schema_leaves(node: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for key, prop in node["properties"].items():
        path = f"{prefix}.{key}" if prefix else key
        if "properties" in prop:
            out.update(_schema_leaves(prop, path))
        else:
            out[path] = prop
    return out


def test_schema_run_keys_match_the_dataclasses() -> None:
    leaves = _schema_leaves(schema()["$defs"]["run"])
    assert sorted(leaves) == sorted(field_paths())


@pytest.mark.parametrize("path", field_paths())
def test_schema_default_equals_dataclass_default(path: str) -> None:
    prop = _schema_leaves(schema()["$defs"]["run"])[path]
    assert prop.get("description"), path
    assert "default" in prop, path
    assert prop["default"] == _get(RunSpec().to_dict(), path), path
    assert type(prop["default"]) is type(_get(RunSpec().to_dict(), path)), path


def test_schema_enums_match_the_enum_classes() -> None:
    leaves = _schema_leaves(schema()["$defs"]["run"])
    for path in field_paths():
        values = _enum_values(path)
        if values:
            assert leaves[path]["enum"] == values, path


def _properties_without_docs(node: Any, where: str = "") -> list[str]:
    missing = []
    if isinstance(node, dict):
        for key, prop in (node.get("properties") or {}).items():
            if not (isinstance(prop, dict) and prop.get("description") and "default" in prop):
                missing.append(f"{where}.{key}")
        for key, child in node.items():
            missing.extend(_properties_without_docs(child, f"{where}.{key}"))
    return missing


def test_every_schema_property_has_description_and_default() -> None:
    assert _properties_without_docs(schema()) == []


def test_schema_maxima_are_the_specs_upper_limits() -> None:
    """`codl plan` names a key past its limit where it was written (`defaults.loader.workers`)
    through the schema's `maximum`; `codl run` of a spec file through UPPER_LIMITS."""
    leaves = _schema_leaves(schema()["$defs"]["run"])
    maxima = {path: leaf["maximum"] for path, leaf in leaves.items() if "maximum" in leaf}
    limits = {key: limit for key, (limit, _) in UPPER_LIMITS.items()}
    assert maxima == {**limits, "seed": MAX_SEED, "dataset.quality": 100}
    assert leaves["runtime.switch_interval_ms"]["anyOf"] == [
        {"const": 0},
        {"minimum": MIN_SWITCH_INTERVAL_MS, "maximum": MAX_SWITCH_INTERVAL_MS},
    ]


@pytest.mark.parametrize(
    ("value", "shown_as"),
    [(float("nan"), "nan"), (float("-inf"), "-inf"), (10**400, "an integer of about 401 digits")],
)
def test_a_float_field_takes_only_finite_numbers(value: Any, shown_as: str) -> None:
    with pytest.raises(ConfigError) as info:
        RunSpec.from_dict({"workload": {"lr": value}})
    assert info.value.problems == (f"workload.lr: got {shown_as}, expected a finite number",)
    assert RunSpec.from_dict({"workload": {"lr": 2}}).workload.lr == 2.0


def test_a_spec_file_with_an_endless_integer_is_refused() -> None:
    with pytest.raises(CodlError, match=r"spec\.json: holds an integer of more than \d+ digits"):
        loads_json('{"seed": ' + "9" * 5000 + "}", source="spec.json")


def test_schema_defaults_of_run_sections_are_valid_specs() -> None:
    run = schema()["$defs"]["run"]["properties"]
    defaults = {k: v["default"] for k, v in run.items()}
    assert RunSpec.from_dict(defaults) == RunSpec()


# --- modes ------------------------------------------------------------------------------------

D, C, M = Mode.DATA, Mode.COMPUTE, Mode.COMM
MODE_TABLE = {
    # mode: (loads, computes, communicates, sleeps, is_isolation, components)
    "data": (True, False, False, False, True, (D,)),
    "compute": (False, True, False, False, True, (C,)),
    "comm": (False, False, True, False, True, (M,)),
    "compute+comm": (False, True, True, False, False, (C, M)),
    "data+compute": (True, True, False, False, False, (D, C)),
    "combined": (True, True, True, False, False, (D, C, M)),
    "data+sleep": (True, False, False, True, False, (D, C)),
}


def test_mode_table_covers_every_mode() -> None:
    assert set(MODE_TABLE) == {m.value for m in Mode}


@pytest.mark.parametrize(("value", "row"), MODE_TABLE.items())
def test_mode_components(value: str, row: tuple[Any, ...]) -> None:
    mode = Mode(value)
    loads, computes, communicates, sleeps, isolation, components = row
    assert mode.loads is loads
    assert mode.computes is computes
    assert mode.communicates is communicates
    assert mode.sleeps is sleeps
    assert mode.is_isolation is isolation
    assert mode.components == components
    assert all(c.is_isolation for c in mode.components)


def test_enums_are_strings() -> None:
    assert Mode("combined") == "combined" and Policy.ISOLATED == "isolated"
    assert json.dumps(Backend.NCCL) == '"nccl"'


def test_published_run_ids_survive_where_the_run_is_unchanged() -> None:
    """The H200 results were measured before `trace.cuda_api` and per-role placement existed.

    Runs under policy `none` do what they did: their ids must hold. Pinned runs were measured
    with every launch role on one core (`launch_cores: 1`, the default then); under the new
    default (`auto`, a CPU per role) they are different runs and must get new ids, so that the
    workflow re-runs them instead of passing old results off as the new placement.
    """
    from pathlib import Path

    import pandas as pd

    from codl.config import load_plan

    # The first one-H200 set (30 steps), kept as a fixture since results/h200 holds its rerun.
    root = Path(__file__).resolve().parent / "data" / "h200-30step"
    runs = pd.read_csv(root / "runs.csv")
    ids = set(load_plan(root / "config.yaml").run_ids)
    unpinned = runs["policy"] == "none"
    assert unpinned.sum() > 0 and (~unpinned).sum() > 0
    assert set(runs.loc[unpinned, "run_id"]) <= ids
    assert not set(runs.loc[~unpinned, "run_id"]) & ids
    assert len(ids) == len(runs)  # the same matrix, nothing lost or added
    base = RunSpec.from_dict({"device": "cuda"})
    on = RunSpec.from_dict({"device": "cuda", "trace": {"cuda_api": True}})
    assert on.run_id != base.run_id
    assert '"cuda_api":true' in on.canonical_json()
    # The scheduling evidence is left out of ids while off, and changes them when on.
    assert '"cuda_api_sched"' not in on.canonical_json()
    sched = RunSpec.from_dict(
        {"device": "cuda", "trace": {"cuda_api": True, "cuda_api_sched": True}}
    )
    assert sched.run_id not in {on.run_id, base.run_id}
    # The trace codec likewise: Blosc, the default, keeps every earlier id; gzip changes it.
    assert '"compression"' not in base.canonical_json()
    gz = RunSpec.from_dict({"device": "cuda", "trace": {"compression": "gzip"}})
    assert gz.trace.compression is TraceCompression.GZIP
    assert gz.run_id != base.run_id
    assert '"cuda_api_sched":true' in sched.canonical_json()
    # a pinned run asked for as it was published keeps its id: only the default changed
    old_isolated = RunSpec.from_dict({"pinning": {"policy": "isolated", "launch_cores": 1}})
    assert '"pinning":{"launch_cores":1,"policy":"isolated"}' in old_isolated.canonical_json()
    # Every committed result set is a part of its own configs' plans (nothing measured under a
    # spec the configs no longer ask for); a set may hold several configs' runs
    # (results/h200x2: config.yaml and config-mechanism.yaml).
    results = Path(__file__).resolve().parents[1] / "results"
    sets = ("h200", "h200x2", "loop-h200", "loop-h200/verify", "loop-h200-jpeg", "loop-h200-heavy")
    for name in sets:
        measured = set(pd.read_csv(results / name / "tables" / "runs.csv")["run_id"])
        configs = sorted((results / name).glob("config*.yaml"))
        if name.endswith("/verify"):  # the verification config `codl advise --out` wrote
            configs = [results / name / ".." / "advice" / "verify.yaml"]
        planned = {i for c in configs for i in load_plan(c).run_ids}
        assert configs and measured <= planned, name


def test_policy_none_ignores_the_other_pinning_keys() -> None:
    base = RunSpec()
    for pinning in (
        {"launch_cores": 3},
        {"autograd": "main", "pin_memory": "loader", "comm": "main"},
    ):
        spec = RunSpec.from_dict({"pinning": {"policy": "none", **pinning}})
        assert spec.run_id == base.run_id, pinning
    main_only = RunSpec.from_dict({"pinning": {"policy": "isolated-main", "autograd": "main"}})
    assert main_only.run_id == RunSpec.from_dict({"pinning": {"policy": "isolated-main"}}).run_id
    isolated = RunSpec.from_dict({"pinning": {"policy": "isolated", "autograd": "main"}})
    assert isolated.run_id != RunSpec.from_dict({"pinning": {"policy": "isolated"}}).run_id


@pytest.mark.parametrize(
    ("launch_cores", "message"),
    [
        (0, "pinning.launch_cores: got 0, expected 'auto' or an integer >= 1"),
        ("two", "pinning.launch_cores: got 'two', expected an integer or 'auto'"),
        (True, "pinning.launch_cores: got True, expected an integer or 'auto'"),
    ],
)
def test_launch_cores_is_auto_or_a_positive_integer(launch_cores: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        RunSpec.from_dict({"pinning": {"launch_cores": launch_cores}})
    assert err.value.problems == (message,)


@pytest.mark.parametrize(
    ("trace", "device", "message"),
    [
        ({"cuda_api": True}, "cpu", "trace.cuda_api: true needs device 'cuda'"),
        (
            {"cuda_api": True, "cupti": True},
            "cuda",
            "trace.cuda_api: true with trace.cupti: true, expected at most one",
        ),
        (
            {"cuda_api_sched": True},
            "cuda",
            "trace.cuda_api_sched: true with trace.cuda_api: false, expected trace.cuda_api: true",
        ),
    ],
)
def test_cuda_api_level_rejects_what_cannot_run(
    trace: dict[str, Any], device: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        RunSpec.from_dict({"device": device, "trace": trace})


# --- the core budget (pinning.cpus) ------------------------------------------------------------


@pytest.mark.parametrize("policy", [p.value for p in Policy])
def test_core_budget_survives_normalization_and_a_round_trip(policy: str) -> None:
    spec = RunSpec.from_dict({"mode": "data", "pinning": {"policy": policy, "cpus": 8}})
    assert spec.normalized().pinning.cpus == 8
    assert RunSpec.from_dict(spec.to_dict()) == spec
    assert '"cpus":8' in spec.canonical_json()
    unbudgeted = RunSpec.from_dict({"mode": "data", "pinning": {"policy": policy}})
    assert spec.run_id != unbudgeted.run_id
    assert RunSpec.from_dict({"mode": "data", "pinning": {"policy": policy, "cpus": 0}}).run_id == (
        unbudgeted.run_id
    )


def test_published_ids_do_not_move_with_the_core_budget() -> None:
    """Two runs of results/loop-h200 (a `data` run under `none`, a `compute` run under
    `isolated`), their specs rebuilt from the committed config: the ids they were published
    under, and a budget set on them gives new ones."""
    from pathlib import Path

    import pandas as pd

    from codl.config import load_plan

    root = Path(__file__).resolve().parents[1] / "results" / "loop-h200"
    runs = pd.read_csv(root / "tables" / "runs.csv").set_index("run_id")
    specs = load_plan(root / "config.yaml").specs
    for run_id, mode, policy in (
        ("37099e0e4df8", "data", "none"),
        ("21f83e93c3c7", "compute", "isolated"),
    ):
        assert (runs.loc[run_id, "mode"], runs.loc[run_id, "policy"]) == (mode, policy)
        spec = specs[run_id]
        assert spec.run_id == run_id
        assert spec.pinning.cpus == 0
        assert '"cpus"' not in spec.canonical_json()
        budgeted = dataclasses.replace(spec, pinning=dataclasses.replace(spec.pinning, cpus=8))
        assert budgeted.run_id != run_id


def test_core_budget_is_a_factor_and_not_negative() -> None:
    from codl.config import build_plan

    plan = build_plan(
        {"experiments": [{"name": "fit", "factors": {"mode": ["data"], "pinning.cpus": [8, 16]}}]}
    )
    assert sorted(s.pinning.cpus for s in plan.specs.values()) == [8, 16]
    with pytest.raises(ConfigError) as err:
        RunSpec.from_dict({"pinning": {"cpus": -1}})
    assert err.value.problems == ("pinning.cpus: got -1, expected an integer >= 0",)
    with pytest.raises(ConfigError, match=r"pinning\.cpus"):
        build_plan({"experiments": [{"name": "fit", "factors": {"pinning.cpus": [-1]}}]})
