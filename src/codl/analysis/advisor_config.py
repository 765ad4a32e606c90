"""The config's ``advisor`` section and the files it asks the workflow for.

Kept apart from ``loop`` (which imports pandas and the model): the Snakefile reads this at
every parse, and a Slurm job parses the Snakefile again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codl.paths import FIGURE_FORMATS, MAP_FIGURE, PREDICTION_FIGURE, ResultPaths

# slurm.cpus_per_rank's default in the config schema: the cores per rank runs were given.
DEFAULT_CORES = 2


@dataclass(frozen=True, kw_only=True)
class AdvisorSettings:
    """The config's ``advisor`` section (schema: description and default of every key)."""

    map: bool = False
    advise: bool = False
    cores: int = 0  # 0: slurm.cpus_per_rank
    repeats: int = 3  # of every verification run
    predictions: str = ""  # a predictions.csv of `advise`: compare it with these runs


def advisor_settings(cfg: Mapping[str, Any]) -> AdvisorSettings:
    section = cfg.get("advisor") or {}
    return AdvisorSettings(
        map=bool(section.get("map", False)),
        advise=bool(section.get("advise", False)),
        cores=int(section.get("cores", 0)),
        repeats=int(section.get("repeats", 3)),
        predictions=str(section.get("predictions", "")),
    )


def cores_per_rank(cfg: Mapping[str, Any]) -> int:
    return int((cfg.get("slurm") or {}).get("cpus_per_rank", DEFAULT_CORES))


def advisor_targets(cfg: Mapping[str, Any], paths: ResultPaths) -> list[str]:
    """The files the workflow makes for the ``advisor`` section (none without one)."""
    s = advisor_settings(cfg)
    out: list[Path] = []
    if s.map:
        out += [paths.map_table, *(paths.figure(MAP_FIGURE, f) for f in FIGURE_FORMATS)]
    if s.advise:
        out += [paths.advice_text, paths.verify_config, paths.predictions_table]
    if s.predictions:
        out += [paths.predicted_vs_measured_table]
        out += [paths.figure(PREDICTION_FIGURE, f) for f in FIGURE_FORMATS]
    return [str(p) for p in out]
