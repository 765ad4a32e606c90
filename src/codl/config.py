"""Workflow configuration: load, validate (JSON Schema + semantics), expand into the run plan.

All problems of a config are collected and raised together as one ``ConfigError``, each line
naming the key path, the value and what was expected, before any job starts.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from codl.errors import ConfigError
from codl.spec import DatasetSpec, Mode, RunSpec, field_paths


def schema() -> dict[str, Any]:
    text = resources.files("codl").joinpath("schemas/config.schema.yaml").read_text()
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def load_yaml(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"{path}: no such config file"], source=str(path))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            [f"{path}: YAML syntax error{where}: {getattr(exc, 'problem', exc)}"],
            source=str(path),
        ) from None
    if data is None:
        raise ConfigError(
            [f"{path}: file is empty, expected a mapping with `experiments`"], source=str(path)
        )
    if not isinstance(data, dict):
        raise ConfigError(
            [f"{path}: got a {type(data).__name__}, expected a mapping with `experiments`"],
            source=str(path),
        )
    return data


def _key_path(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def schema_problems(cfg: Mapping[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema())
    problems = []
    for err in sorted(validator.iter_errors(cfg), key=lambda e: list(map(str, e.absolute_path))):
        key = _key_path(err.absolute_path)
        if err.validator == "additionalProperties":
            allowed = sorted(err.schema.get("properties", {}))
            problems.append(f"{key}: {err.message}; allowed keys: {allowed}")
        else:
            problems.append(f"{key}: {err.message}")
    return problems


@dataclass(frozen=True)
class PlannedRun:
    experiment: str
    spec: RunSpec

    @property
    def run_id(self) -> str:
        return self.spec.run_id


@dataclass(frozen=True)
class Plan:
    """The expanded matrix: every run once (shared between experiments), in config order."""

    runs: tuple[PlannedRun, ...]
    tiers: Mapping[str, str]

    @property
    def specs(self) -> dict[str, RunSpec]:
        out: dict[str, RunSpec] = {}
        for r in self.runs:
            out.setdefault(r.run_id, r.spec.normalized())
        return out

    @property
    def run_ids(self) -> list[str]:
        return list(self.specs)

    def experiments(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for r in self.runs:
            ids = out.setdefault(r.experiment, [])
            if r.run_id not in ids:
                ids.append(r.run_id)
        return out

    def datasets(self) -> dict[tuple[str, str], DatasetSpec]:
        """(name, tier) -> the data set spec, for runs that load data."""
        out: dict[tuple[str, str], DatasetSpec] = {}
        for spec in self.specs.values():
            if spec.mode.loads:
                out[(spec.dataset.name, spec.dataset.tier)] = spec.dataset
        return out


def _set_dotted(target: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = target
    for p in parts[:-1]:
        child = node.get(p)
        if not isinstance(child, dict):
            child = {}
            node[p] = child
        node = child
    node[parts[-1]] = value


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def build_plan(cfg: Mapping[str, Any], *, source: str | None = None) -> Plan:
    """Validate ``cfg`` and expand it; raise one ConfigError listing every problem."""
    problems = schema_problems(cfg)
    if problems:
        raise ConfigError(problems, source=source)
    defaults = cfg.get("defaults", {}) or {}
    tiers = dict(cfg.get("tiers", {}) or {})
    valid_keys = set(field_paths())
    runs: list[PlannedRun] = []
    seen_names: set[str] = set()
    datasets: dict[tuple[str, str], tuple[DatasetSpec, str]] = {}
    for i, exp in enumerate(cfg.get("experiments", [])):
        name = exp["name"]
        where = f"experiments[{i}]"
        if name in seen_names:
            problems.append(f"{where}.name: duplicate experiment name {name!r}")
            continue
        seen_names.add(name)
        base = _merge(defaults, exp.get("base", {}) or {})
        factors: dict[str, list[Any]] = dict(exp.get("factors", {}) or {})
        bad = [k for k in factors if k not in valid_keys or k == "repeat"]
        for k in bad:
            problems.append(
                f"{where}.factors.{k}: unknown factor, expected a dotted run-spec key such as "
                f"mode, loader.workers, pinning.policy (all: {sorted(valid_keys - {'repeat'})})"
            )
        if bad:
            continue
        keys = list(factors)
        combos = list(itertools.product(*(factors[k] for k in keys))) if keys else [()]
        for combo in combos:
            for rep in range(int(exp.get("repeats", 1))):
                d = copy.deepcopy(base)
                for k, v in zip(keys, combo, strict=True):
                    _set_dotted(d, k, v)
                d["repeat"] = rep
                label = ", ".join(f"{k}={v}" for k, v in zip(keys, combo, strict=True))
                run_where = f"{where} ({name}: {label})" if label else f"{where} ({name})"
                try:
                    spec = RunSpec.from_dict(d, where="")
                except ConfigError as exc:
                    problems.extend(f"{run_where}: {p}" for p in exc.problems)
                    continue
                problems.extend(f"{run_where}: {p}" for p in _plan_problems(spec, tiers))
                if spec.mode.loads:
                    key = (spec.dataset.name, spec.dataset.tier)
                    prior = datasets.get(key)
                    if prior is not None and prior[0] != spec.dataset:
                        problems.append(
                            f"{run_where}: dataset.name {spec.dataset.name!r} is defined with "
                            f"different parameters in {prior[1]}; give each variant its own name"
                        )
                    else:
                        datasets[key] = (spec.dataset, run_where)
                runs.append(PlannedRun(name, spec))
    # De-duplicate problems while keeping order: a bad base value repeats for every combination.
    unique = list(dict.fromkeys(problems))
    if unique:
        raise ConfigError(unique, source=source)
    return Plan(runs=tuple(runs), tiers=tiers)


def _plan_problems(spec: RunSpec, tiers: Mapping[str, str]) -> list[str]:
    out: list[str] = []
    from codl.harness import workloads

    if spec.workload.model not in workloads.names():
        out.append(
            f"workload.model: got {spec.workload.model!r}, expected one of {workloads.names()}"
        )
    else:
        kind = workloads.get(spec.workload.model).dataset_kind
        if spec.mode.loads and spec.dataset.kind is not kind:
            out.append(
                f"dataset.kind: got {spec.dataset.kind.value!r}, but workload "
                f"{spec.workload.model!r} reads {kind.value!r} data sets"
            )
    if spec.dataset.tier != "default" and spec.dataset.tier not in tiers:
        out.append(
            f"dataset.tier: got {spec.dataset.tier!r}, expected 'default' or one of "
            f"{sorted(tiers)} (the `tiers` section)"
        )
    if spec.mode is Mode.DATA_SLEEP and spec.steps.warmup < 1:
        out.append(
            "steps.warmup: got 0 with mode 'data+sleep', expected >= 1 (the sleep length is the "
            "compute time measured in the warm-up steps)"
        )
    return out


def load_plan(path: Path) -> Plan:
    return build_plan(load_yaml(path), source=str(path))
