"""The config's ``advisor`` section and the files it asks the workflow for.

Kept apart from ``loop`` (which imports pandas and the model): the Snakefile reads this at
every parse, and a Slurm job parses the Snakefile again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from codl.config import Plan, section_problems, share_problems
from codl.errors import ConfigError
from codl.spec import RunSpec

# slurm.cpus_per_rank's default in the config schema: the cores per rank runs were given.
DEFAULT_CORES = 2


@dataclass(frozen=True, kw_only=True)
class AdvisorSettings:
    """The config's ``advisor`` section (schema: description and default of every key)."""

    map: bool = False
    advise: bool = False
    cores: int = 0  # 0: slurm.cpus_per_rank
    prefer: str = "headroom"  # advise.Prefer: which tied setting wins
    repeats: int = 3  # of every verification run
    predictions: str = ""  # a predictions.csv of `advise`: compare it with these runs
    predictions_sha256: str = ""  # its sha256 when `advise` wrote it
    predicted_at: str = ""  # when `advise` wrote it (UTC, ISO 8601)
    calibrate: str = ""  # a fit's results directory: probe this machine, calibrate, advise


def advisor_settings(cfg: Mapping[str, Any]) -> AdvisorSettings:
    # Read before the plan checks the whole config (the workflow and `codl plan` need the
    # calibration's runs first): the section's own schema problems, each naming its key, so
    # that a word or NaN never reaches int() below.
    problems = section_problems(cfg, "advisor")
    if problems:
        raise ConfigError(problems, source="the config")
    section = cfg.get("advisor") or {}
    return AdvisorSettings(
        map=bool(section.get("map", False)),
        advise=bool(section.get("advise", False)),
        cores=int(section.get("cores", 0)),
        prefer=str(section.get("prefer", "headroom")),
        repeats=int(section.get("repeats", 3)),
        predictions=str(section.get("predictions", "")),
        predictions_sha256=str(section.get("predictions_sha256", "")),
        predicted_at=str(section.get("predicted_at", "")),
        calibrate=str(section.get("calibrate", "")),
    )


def cores_per_rank(cfg: Mapping[str, Any]) -> int:
    return int((cfg.get("slurm") or {}).get("cpus_per_rank", DEFAULT_CORES))


@dataclass(frozen=True, kw_only=True)
class ShareSettings:
    """The config's ``share`` section: jobs that share a node (``codl.steps.share``)."""

    jobs: tuple[str, ...] = ()
    splits: tuple[str, ...] = ("none", "even")
    advised: tuple[int, ...] = ()
    advise_from: tuple[str, ...] = ()  # results directory per job: fit, then advise_split
    fixed: tuple[tuple[str, tuple[int, ...]], ...] = ()  # named splits: CPUs per job
    repeats: int = 1
    cpus: int = 0  # the pool: the first this many CPUs the rule may use; 0 = all


def share_settings(cfg: Mapping[str, Any]) -> ShareSettings:
    """The section, checked beyond the schema (``config.share_problems``, all problems at once,
    as ``codl plan`` reports them)."""
    section = cfg.get("share") or {}
    s = ShareSettings(
        jobs=tuple(str(j) for j in section.get("jobs", ())),
        splits=tuple(str(x) for x in section.get("splits", ("none", "even"))),
        advised=tuple(int(c) for c in section.get("advised", ())),
        advise_from=tuple(str(d) for d in section.get("advise_from", ())),
        fixed=tuple(
            (str(name), tuple(int(c) for c in counts))
            for name, counts in (section.get("fixed") or {}).items()
        ),
        repeats=int(section.get("repeats", 1)),
        cpus=int(section.get("cpus", 0)),
    )
    problems = share_problems(section)
    if problems:
        raise ConfigError(problems, source="the config's share section")
    return s


def share_specs(cfg: Mapping[str, Any], plan: Plan) -> dict[str, RunSpec]:
    """Job name -> its one run's spec, for the ``share`` section's jobs (in order)."""
    experiments = plan.experiments()
    specs = plan.specs
    out: dict[str, RunSpec] = {}
    jobs = share_settings(cfg).jobs
    problems = share_problems(cfg.get("share") or {}, experiments)
    if problems:
        raise ConfigError(problems, source="the config's share section")
    for name in jobs:
        ids = experiments[name]
        out[name] = specs[ids[0]]
    return out
