"""Plans fixed before their runs (docs/preregistration.md).

``codl plan --freeze CONFIG`` writes the config's plan (its settings, its blocks, the claim it
states in ``hypothesis`` and the advisor's predictions it verifies) as canonical JSON with the
sha256 of that content, beside the config's result set. The workflow hands the hash to every run
(``PLAN_ENV``), whose trace records it. A result is *pre-registered* when the frozen plan was
committed to git before its first run started, else *exploratory*; a plan whose blocks grew after
runs existed, or that analyses more blocks than it froze, says so ("blocks added after
looking"): stopping when the interval looks good is a choice the reader must be told of.

Git is the witness because a file's own times are not: a checkout sets them all to now, and a
commit's time travels with the repository.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from codl.errors import CodlError
from codl.spec import PLAN_ATTR, PLAN_ENV

#: The frozen plan file's layout; a reader refuses another.
FORMAT: Final = 1


class Metric(StrEnum):
    COMPUTE_INFLATION = "compute_inflation"
    THROUGHPUT_OVER_TORCH = "throughput_over_torch"


class Statistic(StrEnum):
    GEOMEAN_RATIO = "geomean_ratio"


class Unit(StrEnum):
    INVOCATION = "invocation"
    BLOCK = "block"


class Registration(StrEnum):
    PREREGISTERED = "pre-registered"
    EXPLORATORY = "exploratory"


BLOCKS_ADDED: Final = "blocks added after looking"


@dataclass(frozen=True, kw_only=True)
class Hypothesis:
    """The config's ``hypothesis`` section (schema: description and default of every key)."""

    metric: Metric = Metric.COMPUTE_INFLATION
    statistic: Statistic = Statistic.GEOMEAN_RATIO
    unit: Unit = Unit.INVOCATION
    target: str = ""
    setting: str = ""

    def to_dict(self) -> dict[str, str]:
        return {k: str(v) for k, v in vars(self).items()}


def hypothesis_of(cfg: Mapping[str, Any]) -> Hypothesis | None:
    """The stated claim of a config ``build_plan`` has checked; None without one."""
    section = cfg.get("hypothesis") or {}
    if not section:
        return None
    return Hypothesis(
        metric=Metric(section.get("metric", Metric.COMPUTE_INFLATION)),
        statistic=Statistic(section.get("statistic", Statistic.GEOMEAN_RATIO)),
        unit=Unit(section.get("unit", Unit.INVOCATION)),
        target=" ".join(str(section.get("target", "")).split()),
        setting=" ".join(sorted(str(section.get("setting", "")).split())),
    )


def canonical(obj: Any) -> str:
    """JSON with sorted keys, no spaces and no NaN: one text per content."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def content_hash(content: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(content).encode()).hexdigest()


def _sha256_file(path: Path) -> str:
    from codl.outputs import sha256_of

    return sha256_of(path)


def _predictions(cfg: Mapping[str, Any], config: Path) -> dict[str, str] | None:
    """The advisor's predictions a verification config scores (``advisor.predictions``), with
    the sha256 of the file as it is now: a plan fixes the predictions as well as the runs."""
    from codl.advisor.settings import advisor_settings

    adv = advisor_settings(cfg)
    if not adv.predictions:
        return None
    path = Path(adv.predictions)
    if not path.is_file():
        raise CodlError(
            f"{config}: advisor.predictions: {path} is not a file; a frozen plan records the "
            "predictions' sha256"
        )
    return {
        "file": adv.predictions,
        "sha256": _sha256_file(path),
        "recorded_sha256": adv.predictions_sha256,
        "predicted_at": adv.predicted_at,
    }


def _setting_hash(spec_dict: Mapping[str, Any]) -> str:
    """A run's setting: its spec without the repeat, so that more repeats of the same
    settings read as more blocks, not as other settings."""
    return content_hash({k: v for k, v in spec_dict.items() if k != "repeat"})[:12]


def plan_content(cfg: Mapping[str, Any], config: Path) -> dict[str, Any]:
    """What ``freeze`` fixes of ``cfg`` (loaded from ``config``): the config as loaded (its
    comments and key order are not part of it), every distinct run with its setting and repeat,
    the blocks in their order, the hypothesis and the advisor's predictions."""
    from codl.advisor.settings import advisor_settings
    from codl.config import build_plan, plan_blocks
    from codl.paths import set_name_of

    if advisor_settings(cfg).calibrate:
        # The runs the workflow plans for it (as `codl plan` lists them): the fit's probe.
        from codl.steps.advisor import probe_workflow_config

        cfg = probe_workflow_config(cfg, source=str(config))
    plan = build_plan(cfg, source=str(config))
    runs: dict[str, dict[str, Any]] = {}
    for r in plan.runs:
        row = runs.setdefault(
            r.run_id,
            {
                "run_id": r.run_id,
                "setting": _setting_hash(r.spec.to_dict()),
                "repeat": r.spec.repeat,
                "experiments": [],
            },
        )
        if r.experiment not in row["experiments"]:
            row["experiments"].append(r.experiment)
    hyp = hypothesis_of(cfg)
    return {
        "format": FORMAT,
        "set": set_name_of(cfg, [config]),
        "config": json.loads(canonical(cfg)),
        "runs": sorted(runs.values(), key=lambda row: str(row["run_id"])),
        "blocks": [
            {"index": b.index, "run_ids": list(b.run_ids), "seed": b.seed}
            for b in plan_blocks(cfg, plan)
        ],
        "hypothesis": None if hyp is None else hyp.to_dict(),
        "predictions": _predictions(cfg, config),
    }


@dataclass(frozen=True, kw_only=True)
class FrozenPlan:
    """A frozen plan's content and the sha256 of its canonical JSON."""

    content: Mapping[str, Any]
    sha256: str

    @property
    def n_blocks(self) -> int:
        """Its blocks; without a ``blocks`` section, its repeats (each one a block of its
        own in the runs' tables)."""
        blocks = self.content.get("blocks") or []
        if blocks:
            return len(blocks)
        return len({r["repeat"] for r in self.content.get("runs") or []})

    @property
    def settings(self) -> frozenset[str]:
        return frozenset(str(r["setting"]) for r in self.content.get("runs") or [])

    @property
    def hypothesis(self) -> Any:
        return self.content.get("hypothesis")

    def text(self) -> str:
        """The file's text: sorted keys, indented for a reviewer's diff, and its hash."""
        body = {"plan": self.content, "sha256": self.sha256}
        return json.dumps(body, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def from_text(text: str, *, source: str) -> FrozenPlan:
    """A frozen plan file's text checked: its format and its hash against its content."""
    try:
        body = json.loads(text)
        content, recorded = body["plan"], body["sha256"]
    except (ValueError, KeyError, TypeError) as e:
        raise CodlError(f"{source}: not a frozen plan ({e})") from e
    if not isinstance(content, Mapping) or content.get("format") != FORMAT:
        raise CodlError(f"{source}: plan.format: expected {FORMAT}")
    if content_hash(content) != recorded:
        raise CodlError(
            f"{source}: sha256: {recorded} is not the hash of the plan it holds; "
            "freeze it again (codl plan --freeze CONFIG), never edit it by hand"
        )
    return FrozenPlan(content=content, sha256=recorded)


def read_frozen(path: Path) -> FrozenPlan | None:
    """The frozen plan at ``path``, checked; None where there is none."""
    if not path.is_file():
        return None
    return from_text(path.read_text(encoding="utf-8"), source=str(path))


def recorded_hash(path: Path) -> str:
    """The hash runs record (``PLAN_ENV``): the frozen plan's at ``path``, "" without one."""
    frozen = read_frozen(path)
    return "" if frozen is None else frozen.sha256


def set_dir_of(config: Path, results: Path = Path("results")) -> tuple[dict[str, Any], Path]:
    """The loaded config and the directory of its result set under ``results``."""
    from codl.config import load_yaml
    from codl.paths import set_name_of

    cfg = load_yaml(config)
    return cfg, results / set_name_of(cfg, [config], results)


def freeze(config: Path, results: Path = Path("results")) -> tuple[Path, FrozenPlan]:
    """Write the frozen plan of ``config`` beside its result set; its path and content."""
    from codl.outputs import output_unit
    from codl.paths import frozen_plan_of

    cfg, set_dir = set_dir_of(config, results)
    content = plan_content(cfg, config)
    frozen = FrozenPlan(content=content, sha256=content_hash(content))
    path = frozen_plan_of(set_dir)
    with output_unit([path], mkdir=True) as unit:
        unit.path(path).write_text(frozen.text(), encoding="utf-8")
    return path, frozen


# --- pre-registered or exploratory ---------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Version:
    """One committed version of a frozen plan file."""

    commit: str
    time: datetime.datetime
    plan: FrozenPlan


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def history(path: Path) -> list[Version]:
    """The committed versions of ``path``, oldest first; [] outside git or uncommitted."""
    where = path.resolve().parent
    top = _git(where, "rev-parse", "--show-toplevel")
    if top is None:
        return []
    root = Path(top.strip())
    rel = path.resolve().relative_to(root.resolve()).as_posix()
    # Pathspecs are read relative to the working directory: run from the top.
    log = _git(root, "log", "--format=%H %ct", "--", rel)
    versions = []
    for line in (log or "").splitlines()[::-1]:
        commit, stamp = line.split()
        text = _git(root, "show", f"{commit}:{rel}")
        if text is None:  # the commit deleted it
            continue
        versions.append(
            Version(
                commit=commit,
                time=datetime.datetime.fromtimestamp(int(stamp), tz=datetime.UTC),
                plan=from_text(text, source=f"{path} at {commit[:12]}"),
            )
        )
    return versions


@dataclass(frozen=True, kw_only=True)
class RunsSeen:
    """What the result's runs tables say: when the first run started, and the blocks."""

    first_start: datetime.datetime | None = None
    n_blocks: int = 0


def runs_seen(tables: Sequence[Path]) -> RunsSeen:
    """The earliest ``start_time`` and the distinct blocks (``block``, else ``repeat``, per
    table) of the runs tables that exist among ``tables``."""
    import pandas as pd

    starts: list[datetime.datetime] = []
    blocks: set[tuple[int, str]] = set()
    for i, table in enumerate(t for t in tables if t.is_file()):
        runs = pd.read_csv(table)
        if "start_time" in runs:
            when = pd.to_datetime(runs["start_time"], utc=True, errors="coerce").dropna()
            starts += [t.to_pydatetime() for t in when]
        column = "block" if "block" in runs else "repeat" if "repeat" in runs else None
        if column is not None:
            blocks |= {(i, str(b)) for b in runs[column].dropna() if str(b)}
    return RunsSeen(first_start=min(starts) if starts else None, n_blocks=len(blocks))


@dataclass(frozen=True, kw_only=True)
class PlanStatus:
    """Whether a result was planned before it was seen (see the module docstring)."""

    registration: Registration
    reason: str
    blocks_added: bool = False
    plan_sha256: str = ""
    committed_at: datetime.datetime | None = None
    first_run_at: datetime.datetime | None = None
    plan_blocks: int = 0
    analysed_blocks: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        """``pre-registered``, ``exploratory``, either with ``; blocks added after looking``:
        the pooled tables' column."""
        return self.registration.value + (f"; {BLOCKS_ADDED}" if self.blocks_added else "")

    def line(self) -> str:
        plan = f"plan {self.plan_sha256[:12]}: " if self.plan_sha256 else ""
        return f"{self.label} ({plan}{'; '.join((self.reason, *self.notes))})"


def _when(t: datetime.datetime | None) -> str:
    return "never" if t is None else t.isoformat(timespec="seconds")


def status_of(frozen: FrozenPlan | None, versions: Sequence[Version], seen: RunsSeen) -> PlanStatus:
    """The registration of a result from its frozen plan now, the plan's committed versions
    and its runs: pure, for the tests and for :func:`status`."""
    if frozen is None:
        return PlanStatus(
            registration=Registration.EXPLORATORY,
            reason="no frozen plan (codl plan --freeze CONFIG)",
            first_run_at=seen.first_start,
            analysed_blocks=seen.n_blocks,
        )
    common: dict[str, Any] = {
        "plan_sha256": frozen.sha256,
        "first_run_at": seen.first_start,
        "plan_blocks": frozen.n_blocks,
        "analysed_blocks": seen.n_blocks,
    }
    if not versions:
        return PlanStatus(
            registration=Registration.EXPLORATORY,
            reason="the frozen plan is not committed to git",
            **common,
        )
    first = versions[0].time
    first_run = seen.first_start
    before = [v for v in versions if first_run is None or v.time < first_run]
    after = [v for v in versions if v not in before]
    notes = []
    # Blocks analysed beyond those frozen, or frozen again with more once runs existed.
    grown = max((v.plan.n_blocks for v in after), default=0)
    registered_blocks = max((v.plan.n_blocks for v in before), default=math.inf)
    added = seen.n_blocks > frozen.n_blocks or max(grown, frozen.n_blocks) > registered_blocks
    if added:
        notes.append(
            f"{seen.n_blocks} blocks analysed, {frozen.n_blocks} frozen now, "
            f"{registered_blocks if before else 'none'} before the first run"
        )
    if not before:
        return PlanStatus(
            registration=Registration.EXPLORATORY,
            reason=f"plan first committed {_when(first)}, after the first run {_when(first_run)}",
            blocks_added=added,
            committed_at=first,
            notes=tuple(notes),
            **common,
        )
    registered = before[-1].plan
    # The claim or the settings changed once runs existed: what is reported was not what was
    # fixed, whatever the dates say.
    changed = [
        what
        for what, old, new in (
            ("hypothesis", registered.hypothesis, frozen.hypothesis),
            ("settings", registered.settings, frozen.settings),
        )
        if old != new
    ]
    if changed:
        return PlanStatus(
            registration=Registration.EXPLORATORY,
            reason=f"{' and '.join(changed)} changed after the first run {_when(first_run)}",
            blocks_added=added,
            committed_at=first,
            notes=tuple(notes),
            **common,
        )
    return PlanStatus(
        registration=Registration.PREREGISTERED,
        reason=f"committed {_when(first)}, first run {_when(first_run)}",
        blocks_added=added,
        committed_at=first,
        notes=tuple(notes),
        **common,
    )


def set_status(set_dir: Path, *, runs_tables: Sequence[Path] = ()) -> PlanStatus:
    """Pre-registered or exploratory: the result set in ``set_dir``, its frozen plan, the
    plan's git history and the runs of ``runs_tables`` (default: the set's tables/runs.csv).
    The pooled tables' column: ``set_status(paths.set_dir).label``."""
    from codl.paths import ResultPaths, frozen_plan_of

    path = frozen_plan_of(set_dir)
    tables = list(runs_tables) or [ResultPaths.merged_tables_of(set_dir)[0]]
    frozen = read_frozen(path)
    return status_of(frozen, history(path) if frozen else [], runs_seen(tables))


def status(
    config: Path, results: Path = Path("results"), *, runs_tables: Sequence[Path] = ()
) -> PlanStatus:
    """:func:`set_status` of the result set ``config`` writes under ``results``."""
    return set_status(set_dir_of(config, results)[1], runs_tables=runs_tables)


__all__ = [
    "BLOCKS_ADDED",
    "PLAN_ATTR",
    "PLAN_ENV",
    "FrozenPlan",
    "Hypothesis",
    "PlanStatus",
    "Registration",
    "freeze",
    "history",
    "hypothesis_of",
    "plan_content",
    "read_frozen",
    "recorded_hash",
    "runs_seen",
    "set_status",
    "status",
    "status_of",
]
