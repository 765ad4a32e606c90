"""Pipeline efficiency: what a loading-and-computing run delivers against what its parts allow.

A pipeline can deliver no more than its slower part alone (design, section 13): the *roofline*
of a ``data+compute`` or ``combined`` run is min(data-alone throughput, compute-alone
throughput) of its own block and layout, its twins in modes ``data`` and ``Mode.compute_twin``
(compute, or compute+comm for a run that communicates). Efficiency is the run's throughput over
that roofline; ``over_data`` and ``over_compute`` are over each part alone, so a table says which
part is the roofline (``limiting_part``) and how far the run is from the other one.

The time lost per step (``lost_ms``: the run's step time minus the roofline's, both as
samples per step over throughput, so that they are the wall time the throughput counts) is a
budget of parts, each in ms per step, against the compute twin of the same block::

    lost_ms = lost_data_wait_ms + lost_copy_ms + lost_compute_ms + lost_launch_delay_ms
              + lost_unattributed_ms

  ====================  ======================================================================
  lost_data_wait_ms     the run's mean data wait beyond the wait a perfect pipeline still has
                        when the loader is the roofline (data-alone step - compute-alone step,
                        0 when compute is the roofline)
  lost_copy_ms          the host-to-device copy beyond the compute twin's (its batch is
                        resident on the device)
  lost_launch_delay_ms  the launch roles' on-CPU time and run-queue wait in the compute span
                        beyond the twin's (``decompose``'s host_launch_delay_ms, a run's mean
                        over its steady steps), at most the compute inflation (a GPU hides a
                        late launch while kernels are queued) and at least 0; NaN where the
                        trace cannot tell
  lost_compute_ms       the compute span's inflation over the twin's, less the launch delay
                        (compute inflation = lost_compute_ms + lost_launch_delay_ms)
  lost_unattributed_ms  the rest, signed: step time outside the three spans beyond the twin's,
                        and the flagged steps the throughput counts but the phase means leave
                        out
  ====================  ======================================================================

A part that was not measured (NaN) explains nothing and leaves its share to unattributed, so
the parts add up to ``lost_ms`` exactly, by construction. Over blocks, the efficiency of a
setting is the geometric mean of its per-block efficiencies with a 95 % Student-t interval on
their logs (``runlevel.log_ratio_interval``); the lost time's parts are means over blocks.
A run whose block lacks one of its two twins has no efficiency and says which twin is missing:
a twin is never taken from another block.

Pure: DataFrames in, DataFrames out; the figure is ``codl.figures``' ``efficiency``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import pandas as pd

from codl.analysis import compare as cmp
from codl.analysis.runlevel import log_ratio_interval, runs_blocks
from codl.spec import Mode

#: The modes that have a roofline: they load and compute (data+sleep only sleeps).
EFFICIENCY_MODES: Final = frozenset(
    m.value for m in Mode if m.loads and m.computes and not m.sleeps
)
#: The parts of the lost time, in the order of the budget (the last is the remainder).
PARTS: Final = ("data_wait", "copy", "compute", "launch_delay", "unattributed")
LOST_COLUMNS: Final = tuple(f"lost_{p}_ms" for p in PARTS)
DATA: Final = "data"
COMPUTE: Final = "compute"
#: The limiting part of a setting whose blocks are split evenly between the two.
MIXED: Final = "mixed"
#: What one run's efficiency needs, one row per run (a runs table in this shape:
#: ``efficiency_inputs``): the block it ran in, its throughput and samples per step, its phase
#: means, its launch delay (NaN if unknown) and the run ids of its two twins of its block.
INPUT_COLUMNS: Final = (
    "run_id",
    "mode",
    "block",
    "throughput_samples_s",
    "samples_per_step",
    "data_wait_ms_mean",
    "h2d_ms_mean",
    "compute_eff_ms_mean",
    "launch_delay_ms",
    "data_twin",
    "compute_twin",
)
#: Per run (``run_efficiency``).
RUN_COLUMNS: Final = (
    "data_twin",
    "compute_twin",
    "data_throughput",
    "compute_throughput",
    "roofline_throughput",
    "limiting_part",
    "efficiency",
    "over_data",
    "over_compute",
    "step_time_ms",
    "roofline_step_ms",
    "lost_ms",
    *LOST_COLUMNS,
    "efficiency_note",
)
#: Per setting, over blocks (``efficiency_over_blocks``), after the setting's keys.
SETTING_COLUMNS: Final = (
    "n_runs",
    "n_blocks",
    "n_missing",
    "missing_blocks",
    "per_block",
    "efficiency",
    "efficiency_lo",
    "efficiency_hi",
    "over_data",
    "over_compute",
    "limiting_part",
    "throughput_samples_s",
    "roofline_samples_s",
    "lost_ms",
    *LOST_COLUMNS,
    "biggest_part",
)


def _num(value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def _or_zero(value: float) -> float:
    return value if math.isfinite(value) else 0.0


def run_efficiency(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run of ``runs`` (``INPUT_COLUMNS``) in an ``EFFICIENCY_MODES`` mode: its
    ``RUN_COLUMNS`` against its twins of its block (module docstring), indexed by ``run_id``.
    A run without both twins in ``runs`` (or with a twin of another block) has NaN values and an
    ``efficiency_note`` saying which; ``limiting_part`` is "data" where the loader alone is the
    slower part, else "compute"."""
    missing = [c for c in INPUT_COLUMNS if c not in runs]
    if missing:
        raise ValueError(f"runs: no column(s) {missing}; expected {list(INPUT_COLUMNS)}")
    by_id = {str(r["run_id"]): r for _, r in runs.iterrows()}
    rows: dict[str, dict[str, Any]] = {}
    for rid, r in by_id.items():
        if str(r["mode"]) not in EFFICIENCY_MODES:
            continue
        rows[rid] = _one_run(r, by_id)
    index = pd.Index(list(rows), name="run_id", dtype=object)
    return pd.DataFrame(list(rows.values()), index=index, columns=list(RUN_COLUMNS))


def _twin(r: pd.Series, part: str, by_id: Mapping[str, pd.Series]) -> tuple[pd.Series | None, str]:
    tid = r[f"{part}_twin"]
    if not isinstance(tid, str) or not tid:
        return None, f"no {part}-alone twin in block {r['block'] or '?'}"
    twin = by_id.get(tid)
    if twin is None:
        return None, f"no {part}-alone twin in block {r['block'] or '?'} ({tid} did not run)"
    if str(twin["block"]) != str(r["block"]):
        return None, f"{part}-alone twin {tid} ran in another block ({twin['block']})"
    if not _num(twin["throughput_samples_s"]) > 0:
        return None, f"{part}-alone twin {tid} has no throughput"
    return twin, ""


def _one_run(r: pd.Series, by_id: Mapping[str, pd.Series]) -> dict[str, Any]:
    data, why_d = _twin(r, DATA, by_id)
    comp, why_c = _twin(r, COMPUTE, by_id)
    out: dict[str, Any] = dict.fromkeys(RUN_COLUMNS, math.nan)
    out |= {"data_twin": r["data_twin"], "compute_twin": r["compute_twin"], "limiting_part": ""}
    tput, per_step = _num(r["throughput_samples_s"]), _num(r["samples_per_step"])
    if data is None or comp is None or not tput > 0 or not per_step > 0:
        notes = [w for w in (why_d, why_c) if w] or ["no throughput or samples per step"]
        return out | {"efficiency_note": "; ".join(notes)}
    d, c = _num(data["throughput_samples_s"]), _num(comp["throughput_samples_s"])
    roof = min(d, c)
    step, t_data, t_comp = (1000.0 * per_step / x for x in (tput, d, c))
    lost = step - 1000.0 * per_step / roof
    inflation = _num(r["compute_eff_ms_mean"]) - _num(comp["compute_eff_ms_mean"])
    # The launch delay as far as the compute span shows it: on a GPU a late launch while
    # kernels are still queued costs nothing, so a delay beyond the inflation is not time lost.
    launch = _num(r["launch_delay_ms"])
    if math.isfinite(launch):
        launch = min(max(launch, 0.0), max(_or_zero(inflation), 0.0))
    parts = {
        # A perfect pipeline behind a slower loader still waits out the loader's deficit.
        "data_wait": _or_zero(_num(r["data_wait_ms_mean"])) - max(0.0, t_data - t_comp),
        "copy": _or_zero(_num(r["h2d_ms_mean"])) - _or_zero(_num(comp["h2d_ms_mean"])),
        "compute": inflation - _or_zero(launch),
        "launch_delay": launch,
    }
    parts["unattributed"] = lost - sum(_or_zero(v) for v in parts.values())
    return out | {
        "data_throughput": d,
        "compute_throughput": c,
        "roofline_throughput": roof,
        "limiting_part": DATA if d < c else COMPUTE,
        "efficiency": tput / roof,
        "over_data": tput / d,
        "over_compute": tput / c,
        "step_time_ms": step,
        "roofline_step_ms": step - lost,
        "lost_ms": lost,
        **{f"lost_{p}_ms": v for p, v in parts.items()},
        "efficiency_note": "",
    }


def efficiency_over_blocks(per_run: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Per setting (``keys`` of ``per_run``, which also has ``block``, ``throughput_samples_s``
    and ``RUN_COLUMNS``): ``keys`` then ``SETTING_COLUMNS``. A block's value is the mean of its
    runs' (geometric for ratios); over blocks, efficiency is their geometric mean with a 95 %
    t interval, ``over_data``/``over_compute`` their geometric means, the throughputs and the
    lost time's parts their means. Runs without an efficiency are counted (``n_missing``) and
    their blocks named. ``limiting_part``: the part that is the roofline in most blocks, with
    the count where blocks disagree; ``biggest_part``: the largest mean part of the lost time."""
    cols = [*keys, *SETTING_COLUMNS]
    if per_run.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, g in per_run.groupby(list(keys), sort=True, dropna=False):
        values = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(keys, values, strict=True)), **_setting(g)})
    return pd.DataFrame(rows, columns=cols)


def _geo(values: pd.Series) -> float:
    v = values.astype(float)
    v = v[np.isfinite(v) & (v > 0)]
    return float(np.exp(np.log(v).mean())) if len(v) else math.nan


def _setting(g: pd.DataFrame) -> dict[str, Any]:
    ok = g[np.isfinite(g["efficiency"].astype(float))]
    gone = g[~g.index.isin(ok.index)]
    blocks = ok.groupby("block", sort=True)
    eff = blocks["efficiency"].apply(_geo)
    iv = log_ratio_interval(eff.tolist())
    means = blocks[["throughput_samples_s", "roofline_throughput", "lost_ms", *LOST_COLUMNS]]
    by_block = means.mean()
    limits = ok.groupby("block")["limiting_part"].agg(lambda s: s.mode().iloc[0])
    counts = limits.value_counts().sort_index()
    limiting = ""
    if len(counts) == 1:
        limiting = str(counts.index[0])
    elif len(counts) > 1 and counts.nlargest(2).iloc[0] == counts.nlargest(2).iloc[1]:
        each = ", ".join(f"{k} {int(v)}" for k, v in counts.items())
        limiting = f"{MIXED} ({each} of {len(limits)} blocks)"
    elif len(counts) > 1:
        limiting = f"{counts.idxmax()} ({int(counts.max())} of {len(limits)} blocks)"
    # A part a block did not measure left its share in that block's unattributed: as 0 in the
    # mean, the means of the parts still add up to the mean lost time.
    parts = {
        c: float(by_block[c].fillna(0.0).mean()) if by_block[c].notna().any() else math.nan
        for c in LOST_COLUMNS
    }
    measured = {c: v for c, v in parts.items() if math.isfinite(v)}
    biggest = max(measured, key=lambda c: measured[c]) if measured else ""
    return {
        "n_runs": len(ok),
        "n_blocks": iv.n,
        "n_missing": len(gone),
        "missing_blocks": " ".join(sorted({str(b) for b in gone["block"]})),
        "per_block": " ".join(f"{v:.3f}" for v in eff),
        "efficiency": iv.ratio,
        "efficiency_lo": iv.lo,
        "efficiency_hi": iv.hi,
        "over_data": _geo(blocks["over_data"].apply(_geo)),
        "over_compute": _geo(blocks["over_compute"].apply(_geo)),
        "limiting_part": limiting,
        "throughput_samples_s": float(by_block["throughput_samples_s"].mean()),
        "roofline_samples_s": float(by_block["roofline_throughput"].mean()),
        "lost_ms": float(by_block["lost_ms"].mean()),
        **parts,
        "biggest_part": biggest.removeprefix("lost_").removesuffix("_ms"),
    }


def efficiency_inputs(runs: pd.DataFrame, launch_delay: Mapping[str, float]) -> pd.DataFrame:
    """``INPUT_COLUMNS`` of a runs table as compare writes it (``compare.own_block_twins``: twin
    columns that name the twin of the run's own block, a ``block`` per run), with the launch
    delay per run (``launch_delays``; NaN for a run it lacks). The compute twin is the mode's
    ``compute_twin`` (compute+comm for a run that communicates), else its compute twin."""
    ids = cmp.own_block_twins(runs)
    blocks = runs_blocks(ids)
    out = pd.DataFrame(
        {
            "run_id": ids["run_id"].astype(str),
            "mode": ids["mode"].astype(str),
            "block": ids["run_id"].astype(str).map(blocks).fillna(""),
            "throughput_samples_s": pd.to_numeric(ids["throughput_samples_s"], errors="coerce"),
        }
    )
    world = pd.to_numeric(ids.get("world_size", 1), errors="coerce")
    out["samples_per_step"] = pd.to_numeric(ids["batch_size"], errors="coerce") * world
    for c in ("data_wait_ms_mean", "h2d_ms_mean", "compute_eff_ms_mean"):
        out[c] = pd.to_numeric(ids[c], errors="coerce") if c in ids else math.nan
    out["launch_delay_ms"] = out["run_id"].map(lambda r: launch_delay.get(r, math.nan))
    out["data_twin"] = ids[cmp.twin_column(Mode.DATA)].map(_text)
    out["compute_twin"] = [_compute_twin(row) for _, row in ids.iterrows()]
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _compute_twin(row: pd.Series) -> str:
    mode = str(row["mode"])
    if mode not in EFFICIENCY_MODES:
        return ""
    first = Mode(mode).compute_twin
    for m in (first, Mode.COMPUTE):
        if m is not None and _text(row.get(cmp.twin_column(m))):
            return _text(row.get(cmp.twin_column(m)))
    return ""


def launch_delays(decomposition: pd.DataFrame) -> dict[str, float]:
    """run id -> the mean host launch delay (ms per step) of its steady steps, from a
    decomposition table (``codl.analysis.decompose``); a run it lacks, or whose delay it did
    not measure, is absent."""
    need = {"run_id", "host_launch_delay_ms"}
    if decomposition.empty or not need <= set(decomposition):
        return {}
    d = decomposition
    if "outlier" in d:
        d = d[~d["outlier"].fillna(False).astype(bool)]
    delay = pd.to_numeric(d["host_launch_delay_ms"], errors="coerce")
    means = delay.groupby(d["run_id"].astype(str)).mean().dropna()
    return {str(k): float(v) for k, v in means.items()}


#: The columns ``with_run_efficiency`` adds to a runs table.
RUNS_TABLE_COLUMNS: Final = tuple(c for c in RUN_COLUMNS if c not in ("data_twin", "compute_twin"))


def with_run_efficiency(runs: pd.DataFrame, decomposition: pd.DataFrame) -> pd.DataFrame:
    """The runs table as compare writes it: ``compare.own_block_twins`` and, per run,
    ``RUNS_TABLE_COLUMNS`` (empty for a run without a roofline)."""
    if runs.empty or "mode" not in runs:
        return runs
    table = cmp.own_block_twins(runs)
    per_run = run_efficiency(efficiency_inputs(table, launch_delays(decomposition)))
    joined = per_run.reindex(table["run_id"].astype(str))[list(RUNS_TABLE_COLUMNS)]
    joined["limiting_part"] = joined["limiting_part"].fillna("")
    joined["efficiency_note"] = joined["efficiency_note"].fillna("")
    return table.assign(**{c: joined[c].to_numpy() for c in RUNS_TABLE_COLUMNS})


#: The columns ``with_group_efficiency`` adds to a comparison: its group's efficiency over blocks.
COMPARISON_COLUMNS: Final = (
    "efficiency",
    "efficiency_lo",
    "efficiency_hi",
    "efficiency_blocks",
    "over_data",
    "over_compute",
    "limiting_part",
    "lost_ms",
    *LOST_COLUMNS,
)


def with_group_efficiency(comparison: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """``comparison`` with its group's efficiency over blocks on every row (``COMPARISON_COLUMNS``;
    NaN for a group without a roofline), from a runs table with ``with_run_efficiency``'s
    columns. A row's group is that of the first of its ``runs``."""
    if comparison.empty or "runs" not in comparison or "efficiency" not in runs:
        return comparison.reindex(columns=[*comparison.columns, *COMPARISON_COLUMNS])
    ids = cmp.with_twin_ids(runs)
    per_run = ids.assign(
        run_id=ids["run_id"].astype(str),
        block=ids["run_id"].astype(str).map(runs_blocks(ids)).fillna(""),
        roofline_throughput=pd.to_numeric(ids["roofline_throughput"], errors="coerce"),
    )
    per_run = per_run[per_run["mode"].astype(str).isin(EFFICIENCY_MODES)]
    table = efficiency_over_blocks(per_run, [cmp.GROUP_ID]).set_index(cmp.GROUP_ID)
    table = table.rename(columns={"n_blocks": "efficiency_blocks"})
    group_of = dict(zip(ids["run_id"].astype(str), ids[cmp.GROUP_ID].astype(str), strict=True))
    first = comparison["runs"].fillna("").astype(str).str.split().str[0]
    groups = first.map(lambda r: group_of.get(r, "") if isinstance(r, str) else "")
    picked = table.reindex(groups)[list(COMPARISON_COLUMNS)]
    picked["limiting_part"] = picked["limiting_part"].fillna("")
    return comparison.assign(**{c: picked[c].to_numpy() for c in COMPARISON_COLUMNS})
