"""Workflow configuration: load, validate (JSON Schema + semantics), expand into the run plan.

All problems of a config are collected and raised together as one ``ConfigError``, each line
naming the key path, the value and what was expected, before any job starts.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
import os
import random
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from codl.errors import CodlError, ConfigError
from codl.paths import SET_NAME
from codl.spec import (
    SAFE_NAME,
    DatasetSpec,
    Mode,
    RunSpec,
    did_you_mean,
    field_paths,
    shown,
)

SAFE_NAME_PATTERN = SAFE_NAME.pattern
# The schema's pattern of `name` (a result set, or one invocation of it: codl.paths.SET_NAME).
SET_NAME_PATTERN = rf"^{SET_NAME.pattern}\Z"


def schema() -> dict[str, Any]:
    """The config schema (a copy: the caller may change it)."""
    return copy.deepcopy(_schema())


@functools.cache
def _schema() -> dict[str, Any]:
    # Parsed once: the pure-Python parser takes ~0.15 s for it, and a plan checks the whole
    # config and then each experiment's factor values against it.
    text = resources.files("codl").joinpath("schemas/config.schema.yaml").read_text()
    # libyaml's parser where PyYAML has it: the same safe types, ten times faster, and every
    # invocation of the workflow (and each of its Slurm jobs) parses the schema.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data: dict[str, Any] = yaml.load(text, Loader=loader)
    return data


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys: plain YAML keeps the last one silently, so a
    second `loader:` section would quietly drop the first."""


def _construct_unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:
    first_line: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first defined at line {first_line[key]})",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line + 1
        except TypeError:  # an unhashable key; construct_mapping reports it
            break
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_unique_mapping,
)


def _marked(construct: Any, what: str) -> Any:
    """``construct`` with its ValueError (an integer of more digits than Python converts, a date
    such as 2024-13-01) raised as a YAML error at the value's line and column."""

    def checked(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
        try:
            return construct(loader, node)
        except (ValueError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                # Python's own advice after the ';' (sys.set_int_max_str_digits) is not ours.
                f"{_clip(str(node.value))!r} is not {what} ({str(exc).split(';')[0]})",
                node.start_mark,
            ) from None

    return checked


_StrictLoader.add_constructor(
    "tag:yaml.org,2002:int", _marked(yaml.SafeLoader.construct_yaml_int, "an integer codl reads")
)
_StrictLoader.add_constructor(
    "tag:yaml.org,2002:timestamp", _marked(yaml.SafeLoader.construct_yaml_timestamp, "a date")
)


# A config is a few hundred YAML nodes; these bound what a hostile one can make us do.
MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_NODES = 100_000
MAX_RUNS = 10_000


# libyaml's parser (when PyYAML has it) caps nesting depth and is linear in it; the pure-Python
# scanner takes seconds for 1,000 nested brackets. Composing is only parsing: the nodes are
# then constructed by _StrictLoader, which refuses duplicate keys and unsafe tags.
_COMPOSER: Any = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader


def _expanded_nodes(root: yaml.Node) -> int:
    """Nodes of ``root`` with every alias expanded, stopping once past MAX_YAML_NODES.

    An alias bomb (`b: [*a, *a, ...]` nested ten deep) is a few hundred bytes that expand to
    billions of values: schema validation would walk all of them and print them in its message.
    """
    memo: dict[int, int] = {}

    def count(node: yaml.Node) -> int:
        key = id(node)
        if key in memo:
            return memo[key]
        memo[key] = MAX_YAML_NODES + 1  # a cycle counts as too many
        total = 1
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for kv in node.value for n in kv]
        for child in children:
            total += count(child)
            if total > MAX_YAML_NODES:
                break
        memo[key] = min(total, MAX_YAML_NODES + 1)
        return memo[key]

    return count(root)


def load_yaml(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"{path}: no such config file"], source=str(path))
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(
            [f"{path}: {path.stat().st_size} bytes, expected a config under {MAX_CONFIG_BYTES}"],
            source=str(path),
        )
    try:
        text = path.read_text(encoding="utf-8")
        node = yaml.compose(text, Loader=_COMPOSER)
        if node is not None and _expanded_nodes(node) > MAX_YAML_NODES:
            raise ConfigError(
                [
                    f"{path}: expands to more than {MAX_YAML_NODES} values through YAML "
                    "aliases; expected a config of a few hundred"
                ],
                source=str(path),
            )
        constructor = _StrictLoader("")  # a SafeLoader subclass: safe tags only
        try:
            data = constructor.construct_document(node) if node is not None else None
        finally:
            constructor.dispose()
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: not UTF-8 text ({exc})"], source=str(path)) from None
    except RecursionError:
        raise ConfigError([f"{path}: nested too deeply"], source=str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            [f"{path}: YAML error{where}: {getattr(exc, 'problem', exc)}"],
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


def _key_path(path: Iterable[Any], root: Any, where: str = "") -> str:
    """``path`` as the user reads it (``experiments[0].base.seed``), after ``where``.

    Walked along ``root``: a part is a list index only where ``root`` has a list, so that a
    YAML mapping key that is a number (``defaults: {2: x}``) reads ``defaults.2``, not
    ``defaults[2]``.
    """
    out = where
    node = root
    for part in path:
        out += f"[{part}]" if isinstance(node, list) else (f".{part}" if out else str(part))
        try:
            node = node[part]
        except (LookupError, TypeError):
            node = None
    return out or "<root>"


def _is_integer(checker: Any, instance: Any) -> bool:
    """JSON Schema's integer includes 2.0, which ``int()`` would take and the run spec refuses;
    here an integer is an ``int`` (not a bool: YAML reads `yes` as true), and within a float's
    range, since none of the config's integers is meant past it."""
    return (
        isinstance(instance, int)
        and not isinstance(instance, bool)
        and abs(instance) <= sys.float_info.max
    )


def _is_number(checker: Any, instance: Any) -> bool:
    """Finite numbers only: YAML's `.nan` and `.inf` are floats to JSON Schema, and NaN passes
    every `minimum` and `maximum` (a comparison with NaN is false)."""
    if isinstance(instance, float):
        return math.isfinite(instance)
    return _is_integer(checker, instance)


# The stubs leave `extend` unannotated; it returns a validator class like the one it extends.
_Validator: type[jsonschema.Draft202012Validator] = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"integer": _is_integer, "number": _is_number}
    ),
)

_KIND_WORDS = {
    "integer": "an integer",
    "number": "a finite number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


def _bounds(sub: Mapping[str, Any]) -> str:
    low, high = sub.get("minimum"), sub.get("maximum")
    if low is not None and high is not None:
        return f" from {low} to {high}"
    out = ""
    if low is not None:
        out += f" >= {low}"
    if sub.get("exclusiveMinimum") is not None:
        out += f" > {sub['exclusiveMinimum']}"
    if high is not None:
        out += f" <= {high}"
    return out


# A pattern that admits one word (`^auto$`).
_LITERAL = re.compile(r"\^([\w-]+)\$")


def _expected(sub: Mapping[str, Any], kinds: Any = None) -> str:
    """What schema ``sub`` admits, in words ("an integer from 0 to 19", "an integer >= 1 or
    'auto'"); ``kinds``: the type of a branch's parent, for an `anyOf` branch without one."""
    if "const" in sub:
        return repr(sub["const"])
    if "enum" in sub:
        return f"one of {[str(c) for c in sub['enum']]}"
    kinds = sub.get("type", kinds)
    words = []
    for kind in [kinds] if isinstance(kinds, str) else list(kinds or ()):
        literal = _LITERAL.fullmatch(str(sub.get("pattern", "")))
        if kind == "string" and literal:
            words.append(repr(literal.group(1)))
        else:
            words.append(
                _KIND_WORDS.get(kind, kind)
                + (_bounds(sub) if kind in ("integer", "number") else "")
            )
    return " or ".join(words) or "a value the schema admits"


def _got(value: Any) -> str:
    """A value as the config wrote it: YAML's spelling of booleans and null, and a note that
    `yes`, `no`, `on` and `off` are booleans to YAML (a user who wrote `workers: yes`)."""
    if isinstance(value, bool):
        return f"{str(value).lower()} (YAML reads yes/no/on/off as true/false)"
    return "null" if value is None else shown(value)


def _messages(
    errors: Iterable[Any], root: Any, where: str = ""
) -> list[tuple[tuple[Any, ...], str]]:
    """(path from ``root``, message) of every schema violation, one per offending key; keys
    named after ``where``. A value of the wrong type gets that one line: no bound or pattern
    line besides it."""
    out: list[tuple[tuple[Any, ...], str]] = []
    errors = sorted(errors, key=lambda e: list(map(str, e.absolute_path)))
    mistyped = {tuple(e.absolute_path) for e in errors if e.validator == "type"}
    for err in errors:
        path = tuple(err.absolute_path)
        key = _key_path(path, root, where)
        if err.validator == "additionalProperties" and isinstance(err.instance, Mapping):
            allowed = sorted(err.schema.get("properties", {}))
            for extra in err.instance:
                if extra not in allowed:
                    out.append(
                        (
                            (*path, extra),
                            f"{_key_path((*path, extra), root, where)}: unknown key, "
                            f"expected one of {allowed}" + did_you_mean(str(extra), allowed),
                        )
                    )
        elif "propertyNames" in err.schema_path:
            # jsonschema reports a bad name at its parent's path; name the key itself.
            named = (*path, err.instance)
            out.append((named, f"{_key_path(named, root, where)}: invalid key name, {err.message}"))
        elif err.validator == "type":
            out.append((path, f"{key}: got {_got(err.instance)}, expected {_expected(err.schema)}"))
        elif path in mistyped:
            continue
        elif err.validator == "pattern" and _LITERAL.fullmatch(err.validator_value):
            # `^auto$` beside an integer: "expected an integer >= 1 or 'auto'".
            out.append((path, f"{key}: got {_got(err.instance)}, expected {_expected(err.schema)}"))
        elif err.validator == "anyOf":
            kinds = err.schema.get("type")
            wanted = " or ".join(_expected(branch, kinds) for branch in err.validator_value)
            out.append((path, f"{key}: got {_got(err.instance)}, expected {wanted}"))
        elif err.validator == "enum":
            choices = [str(c) for c in err.validator_value]
            out.append(
                (
                    path,
                    f"{key}: got {err.instance!r}, expected one of {choices}"
                    + did_you_mean(err.instance, choices),
                )
            )
        elif err.validator == "pattern" and err.validator_value == DURATION_PATTERN:
            out.append((path, f"{key}: got {err.instance!r}, expected {_DURATION_WORDS}"))
        elif err.validator == "pattern" and err.validator_value == SET_NAME_PATTERN:
            out.append(
                (
                    path,
                    f"{key}: got {err.instance!r}, expected letters, digits, '_', '.', '-', "
                    "starting with a letter or digit, or <set>/<invocation> of two such names "
                    "(it becomes a path)",
                )
            )
        elif err.validator == "pattern" and err.validator_value == SAFE_NAME_PATTERN:
            out.append(
                (
                    path,
                    f"{key}: got {err.instance!r}, expected letters, digits, '_', "
                    "'.', '-', starting with a letter or digit (it becomes a path)",
                )
            )
        else:
            out.append((path, f"{key}: {_clip(err.message)}"))
    return out


def _schema_errors(cfg: Mapping[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    """(absolute path, message) of every schema violation, one per offending key."""
    return _messages(_Validator(_schema()).iter_errors(cfg), cfg)


def section_problems(cfg: Mapping[str, Any], name: str) -> list[str]:
    """The schema's problems with one top-level section of ``cfg`` (``advisor``, ``blocks``,
    ``share``...), each naming its key: for a reader of that section that runs before
    ``build_plan`` checks the whole config (the workflow reads ``advisor`` first), so that a
    word or NaN where a number is due never reaches its ``int()``."""
    if not isinstance(cfg, Mapping) or name not in cfg:
        return []
    return [msg for path, msg in _schema_errors({name: cfg[name]}) if path[:1] == (name,)]


def schema_problems(cfg: Mapping[str, Any]) -> list[str]:
    return [msg for _, msg in _schema_errors(cfg)]


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
        # Ordered sets: a list's `in` made this quadratic in an experiment's runs (seconds of
        # every DAG build of a 1,000-run matrix).
        out: dict[str, dict[str, None]] = {}
        for r in self.runs:
            out.setdefault(r.experiment, {}).setdefault(r.run_id, None)
        return {name: list(ids) for name, ids in out.items()}

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


# `$NAME` / `${NAME}` in a tier path; anything else after a `$` (`$(cmd)`, a lone `$`) is refused.
_ENV_REF = re.compile(
    r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)
# Quotes, backslash and control characters have no business in a directory name and are the
# tools of shell-quoting tricks; spaces, unicode and other punctuation are allowed (the rules
# quote every parameter).
_BAD_PATH_CHARS = re.compile(r"[\x00-\x1f\x7f'\"`\\]")
# System trees a data set is never staged into (a tier is a scratch directory).
_SYSTEM_DIRS = tuple(
    Path(p) for p in ("/bin", "/boot", "/etc", "/lib", "/lib64", "/proc", "/sbin", "/sys", "/usr")
)


def _is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def resolve_tier(
    key: str, raw: str, *, project_dirs: tuple[Path, ...], environ: Mapping[str, str]
) -> tuple[Path | None, list[str]]:
    """Expand ``~`` and environment variables of one tier path and check where it points.

    A tier directory receives ``<tier>/<dataset name>``, which staging replaces; so it must be an
    absolute directory outside the project (the project's own ``config/`` or ``results/`` would
    be the data set's victims) and outside the system trees. Returns (resolved path, problems).
    """
    where = f"tiers.{key}"
    if not raw.strip():
        return None, [f"{where}: got {raw!r}, expected an absolute directory path"]
    if _BAD_PATH_CHARS.search(raw):
        bad = sorted({repr(c) for c in _BAD_PATH_CHARS.findall(raw)})
        return None, [
            f"{where}: got {_clip(raw)!r} containing {', '.join(bad)}; quotes, backslashes and "
            "control characters are not allowed in a tier path"
        ]
    if "$" in _ENV_REF.sub("", raw):
        return None, [
            f"{where}: got {_clip(raw)!r}; a '$' must start an environment variable "
            "($NAME or ${NAME}), nothing else is expanded"
        ]
    missing = [
        m.group("braced") or m.group("bare")
        for m in _ENV_REF.finditer(raw)
        if (m.group("braced") or m.group("bare")) not in environ
    ]
    if missing:
        # os.path.expandvars would leave `$NAME` in the path and the stage rule would create a
        # directory literally called `$NAME`.
        return None, [
            f"{where}: environment variable(s) {', '.join('$' + n for n in missing)} not set "
            f"(in {_clip(raw)!r}); set them or write the directory out"
        ]
    expanded = _ENV_REF.sub(lambda m: environ[m.group("braced") or m.group("bare")], raw)
    if _BAD_PATH_CHARS.search(expanded):
        return None, [
            f"{where}: {_clip(raw)!r} expands to a path with quotes, backslashes or control "
            "characters"
        ]
    expanded = os.path.expanduser(expanded)
    if not os.path.isabs(expanded):
        return None, [
            f"{where}: got {_clip(raw)!r}"
            + (f" (expands to {_clip(expanded)!r})" if expanded != raw else "")
            + ", expected an absolute directory path (e.g. /dev/shm/codl or $TMPDIR/codl)"
        ]
    # realpath: a symlink in the path must not lead back into the project tree.
    path = Path(os.path.realpath(expanded))
    if path == Path(path.anchor):
        return None, [f"{where}: got {_clip(raw)!r}, the file system root; expected a directory"]
    for root in project_dirs:
        if _is_within(path, root):
            return None, [
                f"{where}: {_clip(raw)!r} resolves to {path}, inside the project directory "
                f"{root}; a tier must be a directory outside the project"
            ]
    for system in _SYSTEM_DIRS:
        if _is_within(path, system):
            return None, [f"{where}: {_clip(raw)!r} resolves to {path}, a system directory"]
    return path, []


def resolve_tiers(
    tiers: Mapping[str, str],
    *,
    project_dirs: tuple[Path, ...],
    environ: Mapping[str, str] | None = None,
) -> tuple[dict[str, str], list[str]]:
    env = os.environ if environ is None else environ
    roots = tuple(Path(os.path.realpath(d)) for d in project_dirs)
    out: dict[str, str] = {}
    problems: list[str] = []
    for key, raw in tiers.items():
        path, found = resolve_tier(str(key), raw, project_dirs=roots, environ=env)
        problems += found
        if path is not None:
            out[str(key)] = str(path)
    return out, problems


def _clip(text: str, limit: int = 200) -> str:
    """A value as a message shows it: whole when short, its start and length when not."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def build_plan(
    cfg: Mapping[str, Any],
    *,
    source: str | None = None,
    project_dirs: tuple[Path, ...] | None = None,
) -> Plan:
    """Validate ``cfg`` and expand it; raise one ConfigError listing every problem.

    Schema violations do not stop the semantic checks of the experiments they leave intact, so
    that one round trip reports every mistake the config makes. ``project_dirs`` (default: the
    working directory) are the trees no storage tier may point into.
    """
    errors = _schema_errors(cfg)
    problems = [msg for _, msg in errors]
    if not isinstance(cfg, Mapping):
        raise ConfigError(problems or ["<root>: expected a mapping"], source=source)
    if "experiments" not in cfg:
        problems.append("experiments: missing, expected a list of experiments (each with a name)")
    # A broken key of `defaults` is reported and left out, so that the experiments are still
    # checked (against the key's default): a config with two mistakes reports both.
    defaults = _without_keys(
        cfg.get("defaults", {}) or {}, [p[1:] for p, _ in errors if p[:1] == ("defaults",)]
    )
    # Shared sections broken: nothing downstream can be trusted.
    shared_broken = any(
        not path or path[0] == "tiers" or path == ("defaults",) for path, _ in errors
    )
    if shared_broken or any(path == ("experiments",) for path, _ in errors):
        raise ConfigError(problems, source=source)
    problems += _repeat_written(cfg, {path for path, _ in errors})
    tiers, tier_problems = resolve_tiers(
        dict(cfg.get("tiers", {}) or {}),
        project_dirs=(Path.cwd(),) if project_dirs is None else project_dirs,
    )
    if tier_problems:
        raise ConfigError(problems + tier_problems, source=source)
    expansion = _Expansion(tiers=tiers, problems=problems)
    _expand_experiments(
        expansion, cfg.get("experiments", []), defaults, {path for path, _ in errors}
    )
    problems += _staging_problems(expansion.datasets, tiers, project_dirs)
    plan = Plan(runs=tuple(expansion.runs), tiers=tiers)
    if not any(path and path[0] == "share" for path, _ in errors):
        problems += share_problems(cfg.get("share") or {}, plan.experiments())
    # De-duplicate problems while keeping order.
    unique = list(dict.fromkeys(problems))
    if unique:
        raise ConfigError(unique, source=source)
    return plan


def load_checked(path: Path) -> dict[str, Any]:
    """A config file read and planned as the workflow would; a problem is one ``CodlError``
    line that starts with the file's name (load_yaml's problems name it already, build_plan's
    name keys)."""
    try:
        cfg = load_yaml(path)
        build_plan(cfg, source=str(path))
    except ConfigError as exc:
        text = exc.one_line()
        raise CodlError(text if text.startswith(str(path)) else f"{path}: {text}") from None
    return cfg


def _repeat_written(cfg: Mapping[str, Any], reported: set[tuple[Any, ...]]) -> list[str]:
    """`repeat` other than 0 written in `defaults` or a `base`: expansion numbers the runs
    (0 to `repeats` - 1), so the value would be overwritten without a word. 0 is let through: it
    is what a spec's ``to_dict()`` holds, written back as defaults."""
    sections: list[tuple[tuple[Any, ...], Any]] = [(("defaults",), cfg.get("defaults"))]
    sections += [
        (("experiments", i, "base"), exp.get("base"))
        for i, exp in enumerate(cfg.get("experiments") or ())
        if isinstance(exp, Mapping)
    ]
    return [
        f"{_key_path((*path, 'repeat'), cfg)}: got {shown(section['repeat'])}, expected 0 or "
        "no `repeat` (each experiment's `repeats` numbers its runs 0, 1, ...)"
        for path, section in sections
        if isinstance(section, Mapping)
        and section.get("repeat", 0) != 0
        and (*path, "repeat") not in reported
    ]


def _without_keys(section: Any, paths: Iterable[tuple[Any, ...]]) -> Any:
    """A copy of ``section`` without the key at each path (cut at its first list index: the
    whole list goes); a path that names the section itself leaves nothing of it."""
    out = copy.deepcopy(section)
    for path in paths:
        keys = list(itertools.takewhile(lambda k: not isinstance(k, int), path))
        if not keys:
            return {}
        parent = out
        for k in keys[:-1]:
            parent = parent.get(k) if isinstance(parent, Mapping) else None
        if isinstance(parent, dict):
            parent.pop(keys[-1], None)
    return out


def share_problems(
    section: Mapping[str, Any], experiments: Mapping[str, list[str]] | None = None
) -> list[str]:
    """Every problem of the ``share`` section beyond its schema, which a plan must refuse: jobs
    named twice (one job would run and count twice), fewer than 2, not experiments of the
    config or planning other than one run (given ``experiments``: name -> run ids); both
    ``advised`` and ``advise_from``; a split whose CPU counts are not one per job.
    """
    jobs = [str(j) for j in section.get("jobs", ()) or ()]
    out: list[str] = []
    twice = sorted({j for j in jobs if jobs.count(j) > 1})
    if twice:
        out.append(f"share.jobs: {twice} listed more than once, expected each job once")
    if jobs and len(jobs) < 2:
        out.append(f"share.jobs: got {jobs}, expected >= 2 jobs to share a node")
    for name in dict.fromkeys(jobs):
        if experiments is None:
            break
        if name not in experiments:
            out.append(
                f"share.jobs: {name!r} is not an experiment, expected one of "
                f"{sorted(experiments)}" + did_you_mean(name, list(experiments))
            )
        elif len(experiments[name]) != 1:
            out.append(
                f"share.jobs: experiment {name!r} plans {len(experiments[name])} runs, expected "
                "exactly one (the job); give it no factors and repeats: 1"
            )
    if section.get("advised") and section.get("advise_from"):
        out.append(
            "share: `advised` (CPUs per job, given) and `advise_from` (fitted here) both set; "
            "expected one of them"
        )
    named = [
        ("share.advised", section.get("advised")),
        ("share.advise_from", section.get("advise_from")),
    ]
    named += [(f"share.fixed.{k}", v) for k, v in (section.get("fixed") or {}).items()]
    for key, counts in named:
        if counts and len(counts) != len(jobs):
            out.append(
                f"{key}: got {list(counts)}, expected one entry per job ({len(jobs)}: {jobs})"
            )
    return out


@dataclass
class _Expansion:
    """What expanding the experiments accumulates, shared across them: a data set name may be
    defined once for the whole config, and MAX_RUNS bounds the whole config."""

    tiers: Mapping[str, str]
    # The caller's list: schema problems first, then these in the order they are found.
    problems: list[str]
    runs: list[PlannedRun] = field(default_factory=list)
    # (name, tier) -> the data set's spec and where it was first defined, for the conflict check.
    datasets: dict[tuple[str, str], tuple[DatasetSpec, str]] = field(default_factory=dict)
    total_planned: int = 0


def _expand_experiments(
    expansion: _Expansion,
    experiments: Iterable[Any],
    defaults: Mapping[str, Any],
    reported: set[tuple[Any, ...]],
) -> None:
    """Expand each experiment the schema left intact (``reported``: the paths of its
    problems); a duplicate name is reported even on a broken one, and only the first
    experiment of a name is expanded. A broken experiment's factor values are still checked
    when its `factors` is intact: they do not depend on what broke."""
    valid_keys = set(field_paths())
    seen_names: set[str] = set()
    broken = {p[1] for p in reported if len(p) >= 2 and p[0] == "experiments"}
    factors_broken = {
        p[1] for p in reported if len(p) >= 3 and p[0] == "experiments" and p[2] == "factors"
    }
    for i, exp in enumerate(experiments):
        where = f"experiments[{i}]"
        name = exp.get("name") if isinstance(exp, Mapping) else None
        if isinstance(name, str) and name in seen_names:
            expansion.problems.append(f"{where}.name: duplicate experiment name {name!r}")
            continue
        if i in broken or not isinstance(name, str):
            if isinstance(exp, Mapping) and i not in factors_broken:
                listed = dict(exp.get("factors", {}) or {})
                if _factors_are_known(where, listed, valid_keys, expansion.problems):
                    _checked_factors(where, listed, expansion.problems)
            continue
        seen_names.add(name)
        base = _merge(defaults, exp.get("base", {}) or {})
        factors: dict[str, list[Any]] = dict(exp.get("factors", {}) or {})
        if not _factors_are_known(where, factors, valid_keys, expansion.problems):
            continue
        factors = _checked_factors(where, factors, expansion.problems)
        repeats = int(exp.get("repeats", 1))
        if not _within_run_limit(expansion, where, factors, repeats):
            continue
        _expand_experiment(expansion, where, name, base, factors, repeats)


def _factors_are_known(
    where: str, factors: Mapping[str, Any], valid_keys: set[str], problems: list[str]
) -> bool:
    """Report every factor that is not a run-spec key (or is `repeat`); True when none is."""
    bad = [k for k in factors if k not in valid_keys or k == "repeat"]
    for k in bad:
        factor_keys = sorted(valid_keys - {"repeat"})
        problems.append(
            f"{where}.factors.{k}: unknown factor"
            + ("; `repeat` is set by `repeats`" if k == "repeat" else "")
            + did_you_mean(k, factor_keys)
            + f" (a dotted run-spec key; all: {factor_keys})"
        )
    return not bad


def _checked_factors(
    where: str, factors: Mapping[str, list[Any]], problems: list[str]
) -> dict[str, list[Any]]:
    """The factor lists without the values their key's schema refuses, each reported once by
    the key the user wrote (``experiments[0].factors.loader.workers: got nan, ...``): the
    schema's `defaults` and `base` checks do not reach a factor's values. The other values
    are still expanded, so that their runs' problems are found in the same round trip."""
    run = _schema()["$defs"]["run"]
    out: dict[str, list[Any]] = {}
    for key, values in factors.items():
        prop = run
        for part in key.split("."):
            prop = prop["properties"][part]
        validator = _Validator(prop)
        kept = []
        for value in values:
            found = _messages(validator.iter_errors(value), value, f"{where}.factors.{key}")
            problems.extend(msg for _, msg in found)  # build_plan drops repeated lines
            if not found:
                kept.append(value)
        out[key] = kept
    return out


def _within_run_limit(
    expansion: _Expansion, where: str, factors: Mapping[str, list[Any]], repeats: int
) -> bool:
    """Count the experiment's runs into the config's total; report it if either passes MAX_RUNS.

    Checked before expanding: 10**9 repeats would otherwise run `codl plan` for hours.
    """
    keys = list(factors)
    planned = math.prod(len(factors[k]) for k in keys) * repeats
    expansion.total_planned += planned
    if repeats > MAX_RUNS:
        expansion.problems.append(
            f"{where}.repeats: got {shown(repeats)}, expected at most {MAX_RUNS} "
            "(runs in the whole config)"
        )
        return False
    if planned > MAX_RUNS or expansion.total_planned > MAX_RUNS:
        expansion.problems.append(
            f"{where}: {planned} runs ({' x '.join(str(len(factors[k])) for k in keys)}"
            f"{' x ' if keys else ''}{repeats} repeats), expected at most {MAX_RUNS} "
            "in the whole config"
        )
        return False
    return True


def _expand_experiment(
    expansion: _Expansion,
    where: str,
    name: str,
    base: dict[str, Any],
    factors: Mapping[str, list[Any]],
    repeats: int,
) -> None:
    """Add one experiment's runs (every factor combination, each ``repeats`` times)."""
    keys = list(factors)
    combos = list(itertools.product(*(factors[k] for k in keys))) if keys else [()]
    # problem -> labels of the combinations it occurs in, to report a mistake of `base`
    # once rather than once per combination.
    found: dict[str, list[str]] = {}
    for combo in combos:
        label = ", ".join(f"{k}={v}" for k, v in zip(keys, combo, strict=True))
        run_where = f"{where} ({name}: {label})" if label else f"{where} ({name})"
        for rep in range(repeats):
            d = copy.deepcopy(base)
            for k, v in zip(keys, combo, strict=True):
                _set_dotted(d, k, v)
            d["repeat"] = rep
            try:
                spec = RunSpec.from_dict(d, where="")
            except ConfigError as exc:
                for p in exc.problems:
                    found.setdefault(p, []).append(label)
                continue
            for p in _plan_problems(spec, expansion.tiers):
                found.setdefault(p, []).append(label)
            if spec.mode.loads:
                _record_dataset(expansion, spec.dataset, run_where)
            expansion.runs.append(PlannedRun(name, spec))
    _report_by_combination(expansion.problems, where, name, found, len(combos))


def _record_dataset(expansion: _Expansion, dataset: DatasetSpec, run_where: str) -> None:
    """Remember where a data set is first defined; report a later run that redefines it, since
    both would be generated into the same directory."""
    key = (dataset.name, dataset.tier)
    prior = expansion.datasets.get(key)
    if prior is not None and prior[0] != dataset:
        expansion.problems.append(
            f"{run_where}: dataset.name {dataset.name!r} is defined with "
            f"different parameters in {prior[1]} "
            f"({_dataset_diff(prior[0], dataset)}); "
            "give each variant its own name"
        )
    else:
        expansion.datasets[key] = (dataset, run_where)


def _report_by_combination(
    problems: list[str],
    where: str,
    name: str,
    found: Mapping[str, list[str]],
    n_combos: int,
) -> None:
    """Report each problem once per combination it occurs in, or once for the experiment when
    every combination has it (a mistake of `base` rather than of a factor)."""
    for p, occurrences in found.items():
        labels = list(dict.fromkeys(occurrences))
        if n_combos > 1 and len(labels) == n_combos:
            problems.append(f"{where} ({name}, every combination): {p}")
        else:
            problems.extend(
                f"{where} ({name}: {label}): {p}" if label else f"{where} ({name}): {p}"
                for label in labels
            )


def _staging_problems(
    datasets: Mapping[tuple[str, str], tuple[DatasetSpec, str]],
    tiers: Mapping[str, str],
    project_dirs: tuple[Path, ...] | None,
) -> list[str]:
    """Data sets whose staging target (``<tier>/<name>``) holds a project directory."""
    problems: list[str] = []
    roots = [Path(os.path.realpath(d)) for d in (project_dirs or (Path.cwd(),))]
    for (dname, tier), (_, run_where) in datasets.items():
        if tier == "default" or tier not in tiers:
            continue
        target = Path(tiers[tier]) / dname
        for root in roots:
            if _is_within(root, target):
                # Staging replaces the target directory: here that would be the project itself.
                problems.append(
                    f"{run_where}: data set {dname!r} on tier {tier!r} would be staged to "
                    f"{target}, which holds the project directory {root}; rename the data set "
                    f"or move tiers.{tier}"
                )
    return problems


def _dataset_diff(a: DatasetSpec, b: DatasetSpec) -> str:
    da, db = a.__dict__, b.__dict__
    return ", ".join(f"{k}: {da[k]!r} vs {db[k]!r}" for k in da if da[k] != db[k])


def _plan_problems(spec: RunSpec, tiers: Mapping[str, str]) -> list[str]:
    out: list[str] = []
    from codl.harness import workloads

    # The reference (registered, entry point or module:factory), the data set kind it reads and
    # builds, and the workload's own checks: each a line naming the key.
    out += workloads.plan_problems(spec)
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


def check_config_files(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Load every config file with codl's loader, for the problems Snakemake's does not see.

    Snakemake reads --configfile with a plain YAML loader: a duplicated key silently keeps the
    last value, and nothing bounds what aliases expand to. The workflow calls this with the
    files Snakemake read, so both entry points refuse the same files with the same messages.
    """
    problems: list[str] = []
    for p in paths:
        try:
            load_yaml(Path(p))
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems, source="the workflow's config files")


def load_plan(path: Path) -> Plan:
    return build_plan(load_yaml(path), source=str(path))


class BlockOrder(StrEnum):
    """How the runs of a block are ordered (config key ``blocks.order``)."""

    ABBA = "abba"
    ROTATE = "rotate"
    SHUFFLE = "shuffle"


@dataclass(frozen=True)
class Block:
    """The runs of one block, in the order they run: back to back, on one machine, in one
    invocation (under Slurm: one job)."""

    index: int
    run_ids: tuple[str, ...]
    # The seed this block's order was drawn from (shuffle), None for abba.
    seed: str | None = None

    @property
    def name(self) -> str:
        return f"block{self.index}"


def plan_blocks(cfg: Mapping[str, Any], plan: Plan) -> tuple[Block, ...]:
    """The blocks of a checked config's plan (``build_plan``): block b holds every distinct run
    of repeat b, so a multi-component run and its isolation twins (same repeat) share a block.
    ``abba`` runs even blocks in config order and odd ones reversed, so that drift within a
    block cancels over two; ``rotate`` puts each loading setting first in turn (``_rotated``);
    ``shuffle`` draws each block's order from ``"{seed}:{b}"``. Empty without a ``blocks``
    section (every run on its own, in no set order). The one block order of the project: the
    workflow chains runs in it and ``codl plan`` lists it."""
    problems = section_problems(cfg, "blocks")
    if problems:  # a config `build_plan` has not checked
        raise ConfigError(problems)
    section = cfg.get("blocks")
    if not section:
        return ()
    order = BlockOrder(section.get("order", BlockOrder.ABBA.value))
    seed = int(section.get("seed", 0))
    specs = plan.specs  # a property that builds the dict anew: once
    by_repeat: dict[int, list[str]] = {}
    for rid, spec in specs.items():
        by_repeat.setdefault(spec.repeat, []).append(rid)
    blocks = []
    for b in sorted(by_repeat):
        ids = list(by_repeat[b])
        drawn: str | None = None
        if order is BlockOrder.ABBA and b % 2:
            ids.reverse()
        elif order is BlockOrder.ROTATE:
            ids = _rotated(ids, specs, b)
        elif order is BlockOrder.SHUFFLE:
            drawn = f"{seed}:{b}"
            # A string seed is hashed (sha512) by random: the same order on every Python.
            random.Random(drawn).shuffle(ids)
        blocks.append(Block(index=b, run_ids=tuple(ids), seed=drawn))
    return tuple(blocks)


def _rotated(ids: Sequence[str], specs: Mapping[str, RunSpec], b: int) -> list[str]:
    """Block ``b``'s order under ``rotate``: the loading runs in config order, rotated by ``b``
    (with abba's reversal a setting in the middle never goes first, and a drift over the block
    would read as its effect), each beside its compute twin, the twin first in even blocks and
    second in odd ones (each pair ABBA over two blocks); a twin shared by several settings runs
    once, where its first setting puts it; the other runs after them, in config order."""
    loading = [rid for rid in ids if specs[rid].mode.loads]
    if loading:
        turn = b % len(loading)
        loading = loading[turn:] + loading[:turn]
    present = set(ids)
    placed: dict[str, None] = {}  # an ordered set
    for rid in loading:
        twin_mode = specs[rid].mode.compute_twin
        twin = specs[rid].with_mode(twin_mode).run_id if twin_mode is not None else None
        for r in (twin, rid) if b % 2 == 0 else (rid, twin):
            if r is not None and r in present:
                placed.setdefault(r, None)
    return [*placed, *(rid for rid in ids if rid not in placed)]


# `blocks.budget`: seconds, or a duration such as `90s`, `30m`, `1h30m`, `1.5h` (the schema
# holds the same pattern, so a value it admits always parses here).
DURATION_PATTERN = r"^\s*(\d+(\.\d+)?\s*[smhd]\s*)+$"
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(value: float | str, *, key: str) -> float:
    """Seconds of a duration as the config writes it: a number of seconds or a string of
    number-unit parts (``s``, ``m``, ``h``, ``d``); ConfigError naming ``key`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError([f"{key}: got {_got(value)}, expected {_DURATION_WORDS}"])
    if isinstance(value, str):
        if not re.fullmatch(DURATION_PATTERN, value):
            raise ConfigError([f"{key}: got {value!r}, expected {_DURATION_WORDS}"])
        return float(sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value)))
    if not math.isfinite(value) or value < 0:
        raise ConfigError([f"{key}: got {_got(value)}, expected {_DURATION_WORDS}"])
    return float(value)


_DURATION_WORDS = "seconds >= 0 or a duration such as '90s', '30m', '1h30m'"


def block_budget(cfg: Mapping[str, Any]) -> float | None:
    """``blocks.budget`` in seconds: after it no new block starts in an invocation of the
    workflow (the first always does); None without one."""
    problems = section_problems(cfg, "blocks")
    if problems:  # a config `build_plan` has not checked: the schema's line, not ours
        raise ConfigError(problems)
    value = (cfg.get("blocks") or {}).get("budget")
    return None if value is None else duration_seconds(value, key="blocks.budget")


def analysed_blocks(
    cfg: Mapping[str, Any], blocks: Sequence[Block], measured: Callable[[str], bool]
) -> tuple[Block, ...]:
    """The blocks one invocation of the workflow runs and analyses: every block whose runs are
    all ``measured`` already, and, in block order, at most ``blocks.per_invocation`` of the
    others (all of them without the key). A block left half-measured by a failed invocation is
    one of the others: the next invocation finishes it first."""
    per = (cfg.get("blocks") or {}).get("per_invocation")
    done = [b for b in blocks if all(measured(rid) for rid in b.run_ids)]
    todo = [b for b in blocks if b not in done]
    started = todo if per is None else todo[: int(per)]
    return tuple(b for b in blocks if b in done or b in started)


def held_of_planned(held: int, planned: int) -> str:
    """The fact every block report states: "1 of 2 planned blocks"."""
    return f"{held} of {planned} planned blocks"


def block_progress(
    blocks: Sequence[Block], analysed: Sequence[Block], *, budget_spent: Sequence[Block] = ()
) -> list[dict[str, Any]]:
    """One row per planned block: its runs, whether this invocation's analysis holds it and,
    if not, why (``budget``: in ``budget_spent``, blocks ``blocks.budget`` ran out before;
    ``per_invocation``: past that many new blocks), and how many of the planned blocks the
    analysis holds (``held_of_planned``)."""
    held = {b.index for b in analysed}
    spent = {b.index for b in budget_spent}
    coverage = held_of_planned(len(held), len(blocks))
    return [
        {
            "block": b.name,
            "runs": len(b.run_ids),
            "analysed": b.index in held,
            "not_run": ""
            if b.index in held
            else ("budget" if b.index in spent else "per_invocation"),
            "held": coverage,
            "run_ids": " ".join(b.run_ids),
        }
        for b in blocks
    ]


@dataclass(frozen=True)
class BlockSlot:
    """Where a run sits in its block: the block's name and the run before it (None: first)."""

    block: str
    previous: str | None


def block_slots(blocks: Iterable[Block]) -> dict[str, BlockSlot]:
    """run id -> its ``BlockSlot``: what the workflow chains and groups runs by."""
    out: dict[str, BlockSlot] = {}
    for blk in blocks:
        for i, rid in enumerate(blk.run_ids):
            out[rid] = BlockSlot(blk.name, blk.run_ids[i - 1] if i else None)
    return out
