"""A block experiment reduced: one row per run, then per loading setting its compute inflation
over blocks (each loading run against the compute twin of its own block), and the ring
hand-off's throughput over the best torch setting of the same block.

A *block* here is (``source``, ``repeat``): the runs of one repeat of one results directory (a
workflow's ``blocks`` section runs repeat b as block b), ``source`` numbering the runs tables
:func:`pool_runs` joins. No pair crosses a block: a loading run whose twin its block lacks is
counted in ``n_unpaired`` and named in ``unpaired_blocks``, never paired with a twin of another
block. Intervals are over blocks (ratios: geometric mean, Student t on the logs) or over runs
(per-step quantities: mean, Student t), from :mod:`codl.analysis.runlevel`.

Pure: DataFrames (and a run's trace tables) in, DataFrames out; the figure is
:mod:`codl.figures.intervention`'s.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import pandas as pd

from codl.analysis import columns
from codl.analysis import efficiency as eff
from codl.analysis.runlevel import log_ratio_interval, mean_interval
from codl.analysis.sleeps import launch_sleeps, run_sleeps
from codl.spec import Mode, RunSpec

log = logging.getLogger(__name__)

FACTOR: Final = "switch_interval_ms"
#: The per-run statistic a loading run and its twin are paired on: the mean compute span.
PAIR_METRIC: Final = "compute_eff_ms_mean"
#: The knobs that make a loading setting: runs that differ in anything else belong in tables
#: of their own.
KNOBS: Final = (
    "policy",
    FACTOR,
    "sharing_strategy",
    "pin_memory",
    "pin_memory_place",
    "handoff",
    "workers",
    "worker_nice",
    "copy_ahead",
)
#: What a knob is when a runs table predates its column: the spec's default, and for
#: ``workers`` the 12 of every config measured before the column (config/gil-h200.yaml,
#: config/blocks-h200*.yaml).
KNOB_DEFAULTS: Final[Mapping[str, str | float]] = {
    "policy": "none",
    FACTOR: 0.0,
    "sharing_strategy": "file_descriptor",
    "handoff": "torch",
    "workers": 12,
    "worker_nice": 0,
    "copy_ahead": False,
}
#: The block of a run: the runs table it came from and its repeat.
BLOCK_KEYS: Final = ("source", "repeat")
INFLATION_COLUMNS: Final = (
    *KNOBS,
    "n_runs",
    "n_blocks",
    "n_unpaired",
    "unpaired_blocks",
    "per_block",
    "inflation",
    "inflation_lo",
    "inflation_hi",
    "timer_sleep_ms_p50",
    "timer_sleeps_per_step",
    "gil_wait_ms_per_step",
    "gil_wait_lo",
    "gil_wait_hi",
    "timer_sleep_ms_per_step",
    "pin_memory_sleep_ms_per_step",
    "throughput_samples_s",
    "throughput_lo",
    "throughput_hi",
)
THROUGHPUT_COLUMNS: Final = (
    "policy",
    "workers",
    "worker_nice",
    "copy_ahead",
    "n_blocks",
    "ring_over_best_torch",
    "lo",
    "hi",
)


def twin_id(spec: RunSpec) -> str:
    """The compute twin of a loading run: the same spec without the loader, same repeat (so
    same block); "" for a mode that has none (``data`` alone measures the loader)."""
    twin = spec.mode.compute_twin
    return "" if twin is None else spec.with_mode(twin).run_id


def data_twin_id(spec: RunSpec) -> str:
    """The data-alone twin of a loading and computing run, same repeat (so same block): the
    other half of its roofline (``codl.analysis.efficiency``); "" for any other mode."""
    return "" if spec.mode.compute_twin is None else spec.with_mode(Mode.DATA).run_id


def run_row(
    spec: RunSpec,
    *,
    summary: pd.DataFrame,
    steps: pd.DataFrame,
    tables: Mapping[str, pd.DataFrame],
    attrs: Mapping[str, Any],
) -> dict[str, object]:
    """One run's row: its factors, mean compute span, throughput, and its launch roles' sleeps
    by what ended them (``codl.analysis.sleeps``; zeros and NaN without the scheduler record).
    ``summary``/``steps``: its summarize tables; ``tables``/``attrs``: its trace's."""
    row: dict[str, object] = {
        "run_id": spec.run_id,
        "mode": spec.mode.value,
        "policy": spec.pinning.policy.value,
        FACTOR: spec.runtime.switch_interval_ms,
        "sharing_strategy": spec.loader.sharing_strategy.value,
        "pin_memory": spec.loader.pin_memory,
        "pin_memory_place": spec.pinning.pin_memory.value,
        "handoff": spec.loader.handoff.value,
        "workers": spec.loader.workers,
        "worker_nice": spec.loader.worker_nice,
        "copy_ahead": spec.loader.copy_ahead,
        "repeat": spec.repeat,
        "twin_id": twin_id(spec) if spec.mode.loads else "",
        "data_twin_id": data_twin_id(spec),
        "switch_interval_s": attrs.get("switch_interval_s"),
        PAIR_METRIC: float(steps["compute_eff_ms"].mean()),
        "throughput_samples_s": float(summary["throughput_samples_s"].iloc[0]),
        "steps": len(steps),
        # What the roofline's lost time is made of (codl.analysis.efficiency).
        "samples_per_step": _first(summary, "batch_size") * _first(summary, "world_size", 1.0),
        "data_wait_ms_mean": _first(summary, "data_wait_ms_mean"),
        "h2d_ms_mean": _first(summary, "h2d_ms_mean"),
    }
    sleeps = launch_sleeps(tables, warmup=columns.warmup_steps(dict(attrs)))
    per_run = run_sleeps(sleeps, steps=max(len(steps), 1))
    row.update(per_run)
    # The GIL's share of the sleeps: ended by the timer (the timed wait ran out) or by the
    # pin-memory thread letting go; a loader's wake-up is the batch arriving, not the GIL.
    row["gil_wait_ms_per_step"] = (
        per_run["timer_sleep_ms_per_step"] + per_run["pin_memory_sleep_ms_per_step"]
    )
    return row


def _first(summary: pd.DataFrame, column: str, default: float = float("nan")) -> float:
    if column not in summary or summary[column].isna().all():
        return default
    return float(summary[column].iloc[0])


def with_knob_defaults(runs: pd.DataFrame) -> pd.DataFrame:
    """Every knob column present and filled: a table written before a knob existed lacks its
    column, and pooled with a newer one has NaN in it, which groupby would drop silently."""
    return runs.assign(
        **{k: runs[k].fillna(v) if k in runs else v for k, v in KNOB_DEFAULTS.items()}
    )


def blocked(runs: pd.DataFrame) -> pd.DataFrame:
    """``with_knob_defaults``, and ``source`` 0 in a table ``pool_runs`` did not join: a run's
    block is then (``source``, ``repeat``) in every table."""
    runs = with_knob_defaults(runs)
    return runs if "source" in runs else runs.assign(source=0)


#: The columns of a runs table that hold run ids: hex strings, one of only digits not a number.
ID_COLUMNS: Final = ("run_id", "twin_id", "data_twin_id")


def read_runs(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A runs table (``pooled_runs.csv``, ``gil_runs.csv``) as written, its ids kept strings."""
    return pd.read_csv(path, dtype=dict.fromkeys(ID_COLUMNS, str), low_memory=False)


def pool_runs(tables: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Several runs tables (one per results directory or call) as one, ``source`` numbering
    them, so that each table's repeats stay blocks of their own. The same run in two tables is
    refused: it would count twice."""
    runs = pd.concat([t.assign(source=i) for i, t in enumerate(tables)], ignore_index=True)
    twice = runs.loc[runs["run_id"].duplicated(), "run_id"].unique().tolist()
    if twice:
        raise ValueError(f"run_id: {twice} appear in two of the {len(tables)} runs tables")
    return runs


def paired(runs: pd.DataFrame) -> pd.DataFrame:
    """The loading runs (those naming a twin), each with ``ratio``: its ``PAIR_METRIC`` over
    its twin's in the same block; NaN where the block lacks the twin (or its metric)."""
    runs = blocked(runs)
    keys = list(BLOCK_KEYS)
    twins = runs[[*keys, "run_id", PAIR_METRIC]].rename(
        columns={"run_id": "twin_id", PAIR_METRIC: "twin_metric"}
    )
    loaded = runs[runs["twin_id"].fillna("").astype(str) != ""]
    # A left join on the block and the twin's id: a twin of another block never matches.
    out = loaded.merge(twins, on=[*keys, "twin_id"], how="left", validate="many_to_one")
    ratio = out[PAIR_METRIC].astype(float) / out["twin_metric"].astype(float)
    out["ratio"] = ratio.where(np.isfinite(ratio) & (ratio > 0))
    return out.drop(columns="twin_metric").sort_values(keys, ignore_index=True)


def inflation(runs: pd.DataFrame) -> pd.DataFrame:
    """Per loading setting (``KNOBS``): each block's compute inflation (the run over its twin of
    the same block) and, over blocks, their geometric mean with a 95 % t interval; the GIL wait
    per step and the throughput as means over the paired runs with a t interval; the blocks
    whose twin is missing counted and named. Two runs of one setting in a block are refused:
    they would count as two blocks. Columns: ``INFLATION_COLUMNS``."""
    loaded = paired(runs)
    rows = []
    for key, g in loaded.groupby(list(KNOBS), sort=True):
        knobs = dict(zip(KNOBS, key, strict=True))
        if g.duplicated(list(BLOCK_KEYS)).any():
            raise ValueError(f"setting {knobs}: two runs in a block")
        rows.append({**knobs, **_setting_row(g)})
        if rows[-1]["n_unpaired"]:
            log.warning(
                "setting %s: no twin in block(s) %s; left out of its inflation",
                knobs,
                rows[-1]["unpaired_blocks"],
            )
    return pd.DataFrame(rows, columns=list(INFLATION_COLUMNS))


def _block_name(source: object, repeat: object) -> str:
    return f"{source}:{repeat}"


def _setting_row(g: pd.DataFrame) -> dict[str, object]:
    unpaired = g[g["ratio"].isna()]
    g = g[g["ratio"].notna()]
    iv = log_ratio_interval(g["ratio"].tolist())
    gil = mean_interval(g["gil_wait_ms_per_step"].astype(float).tolist())
    tput = mean_interval(g["throughput_samples_s"].astype(float).tolist())
    return {
        "n_runs": len(g) + g["twin_id"].nunique(),
        "n_blocks": iv.n,
        "n_unpaired": len(unpaired),
        "unpaired_blocks": " ".join(
            _block_name(s, r) for s, r in zip(unpaired["source"], unpaired["repeat"], strict=True)
        ),
        "per_block": " ".join(f"{100 * (r - 1):+.1f}" for r in g["ratio"]),
        "inflation": iv.ratio - 1,
        "inflation_lo": iv.lo - 1,
        "inflation_hi": iv.hi - 1,
        "timer_sleep_ms_p50": g["timer_sleep_ms_p50"].median(),
        "timer_sleeps_per_step": g["timer_sleeps_per_step"].mean(),
        "gil_wait_ms_per_step": gil.mean,
        "gil_wait_lo": gil.lo,
        "gil_wait_hi": gil.hi,
        "timer_sleep_ms_per_step": g["timer_sleep_ms_per_step"].mean(),
        "pin_memory_sleep_ms_per_step": g["pin_memory_sleep_ms_per_step"].mean(),
        "throughput_samples_s": tput.mean,
        "throughput_lo": tput.lo,
        "throughput_hi": tput.hi,
    }


def throughput_versus_torch(runs: pd.DataFrame) -> pd.DataFrame:
    """Per ring setting (every knob): in each block, its throughput over the best torch
    setting's with the same workers in that block (any policy: the stricter comparison); over
    blocks the geometric mean with a 95 % t interval. Two runs of one ring setting in a block
    are refused, as in ``inflation``. Empty (``THROUGHPUT_COLUMNS``) without ring runs."""
    loading = blocked(runs[runs["mode"] == "data+compute"])
    keys = [k for k in KNOBS if k in loading]
    rows = []
    for key, g in loading[loading["handoff"] == "ring"].groupby(keys):
        knobs = dict(zip(keys, key, strict=True))
        if g.duplicated(list(BLOCK_KEYS)).any():
            raise ValueError(f"setting {knobs}: two runs in a block")
        ratios = []
        for (source, rep), r in g.groupby(list(BLOCK_KEYS)):
            same = loading[
                (loading["source"] == source)
                & (loading["repeat"] == rep)
                & (loading["handoff"] == "torch")
                & (loading["workers"] == knobs["workers"])
            ]
            if len(same):
                best = float(same["throughput_samples_s"].max())
                ratios.append(float(r["throughput_samples_s"].iloc[0]) / best)
        iv = log_ratio_interval(ratios)
        rows.append(
            {
                "policy": knobs["policy"],
                "workers": knobs["workers"],
                "worker_nice": knobs["worker_nice"],
                "copy_ahead": knobs["copy_ahead"],
                "n_blocks": iv.n,
                "ring_over_best_torch": iv.ratio,
                "lo": iv.lo,
                "hi": iv.hi,
            }
        )
    return pd.DataFrame(rows, columns=list(THROUGHPUT_COLUMNS))


#: Per loading setting: ``KNOBS`` then the efficiency over blocks (``efficiency.SETTING_COLUMNS``).
EFFICIENCY_COLUMNS: Final = (*KNOBS, *eff.SETTING_COLUMNS)
#: What ``efficiency`` needs of a runs table beyond ``run_row``'s columns of every version.
EFFICIENCY_INPUTS: Final = ("data_twin_id", "samples_per_step", "data_wait_ms_mean", "h2d_ms_mean")


def efficiency(runs: pd.DataFrame, launch_delay: Mapping[str, float]) -> pd.DataFrame:
    """Per loading setting (``KNOBS``): its throughput over the roofline of each block (min of
    the data-alone and compute-alone twins' throughputs of that block) and, over blocks, the
    geometric mean with a 95 % t interval, both ratios, the limiting part and the lost time's
    parts in ms per step (``codl.analysis.efficiency``); ``launch_delay``: run id -> host launch
    delay (``efficiency.launch_delays``). Runs whose block lacks a twin are counted and named,
    never paired across blocks. Columns: ``EFFICIENCY_COLUMNS``."""
    runs = blocked(runs)
    missing = [c for c in EFFICIENCY_INPUTS if c not in runs]
    if missing:
        raise ValueError(
            f"runs: no column(s) {missing}: a pooled runs table written before the roofline; "
            "pool the runs again"
        )
    block = [_block_name(s, r) for s, r in zip(runs["source"], runs["repeat"], strict=True)]
    inputs = pd.DataFrame(
        {
            "run_id": runs["run_id"].astype(str),
            "mode": runs["mode"].astype(str),
            "block": block,
            "throughput_samples_s": runs["throughput_samples_s"].astype(float),
            "samples_per_step": runs["samples_per_step"].astype(float),
            "data_wait_ms_mean": runs["data_wait_ms_mean"].astype(float),
            "h2d_ms_mean": runs["h2d_ms_mean"].astype(float),
            "compute_eff_ms_mean": runs[PAIR_METRIC].astype(float),
            "launch_delay_ms": [launch_delay.get(r, math.nan) for r in runs["run_id"].astype(str)],
            "data_twin": runs["data_twin_id"].fillna("").astype(str),
            "compute_twin": runs["twin_id"].fillna("").astype(str),
        }
    )
    per_run = eff.run_efficiency(inputs)
    loading = runs.assign(run_id=runs["run_id"].astype(str), block=block).set_index("run_id")
    per_run = per_run.join(loading[[*KNOBS, "block", "throughput_samples_s"]])
    table = eff.efficiency_over_blocks(per_run, list(KNOBS))
    for _, row in table[table["n_missing"] > 0].iterrows():
        log.warning(
            "setting %s: no roofline in block(s) %s (a twin missing); left out of its efficiency",
            {k: row[k] for k in KNOBS},
            row["missing_blocks"],
        )
    return table.reindex(columns=list(EFFICIENCY_COLUMNS))
