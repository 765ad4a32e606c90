"""Loader advisor: the setting (workers, policy, launch cores per rank) with the highest predicted
throughput for a core budget, and a config that verifies it by re-running it and its neighbours.

``advise`` evaluates the fitted model (``codl.advisor.model``) over a grid: every fitted policy,
1 .. ``max_workers`` loader workers, and for the pinned policies the launch set ``auto`` plus a
few CPUs more. It picks the highest predicted throughput; settings within ``tie`` of it count as
equal, and ``Prefer`` says which of them wins: by default the fewest launch CPUs, then loader
headroom (workers up to the loader's cores), or the fewest cores occupied.

The command ``codl advise RESULTS_DIR`` is ``codl.cli.advise``; fitting on a results directory
is ``codl.steps.advisor.fit_results``.
"""

from __future__ import annotations

import copy
import enum
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from codl.advisor import model as mdl
from codl.analysis import efficiency as eff
from codl.spec import Handoff, Policy

#: Added to the fitted runs' seed in a verification config (see ``verification_config``).
VERIFY_SEED_OFFSET = 1
#: How many launch CPUs beyond ``auto`` the grid tries for the pinned policies.
EXTRA_LAUNCH_CORES = 2


class Prefer(enum.StrEnum):
    """Which of the settings predicted within ``tie`` of the best the advisor picks.

    ``headroom`` (default): the fewest launch CPUs, then workers up to the loader's cores ``c_L``
    (the fewest that reach ``c_L``, else the most below it). The model's plateau is flat from the
    fewest workers that keep the loader ahead, but that edge has no margin: on one H200 the
    advice at the edge (5 workers) ran at 0.90 [0.84, 0.97] of 16 workers, its compute 1.52x
    slower than alone against 1.35x (docs/advisor.md, "The verification"). A worker up to
    ``c_L`` costs no core the launch roles use, so the model predicts it free.

    ``fewest-cores``: the fewest cores occupied (launch set + workers up to ``c_L``), then the
    fewest workers: leaves the most cores to other jobs, at the plateau's edge.
    """

    HEADROOM = "headroom"
    FEWEST_CORES = "fewest-cores"


@dataclass(frozen=True, kw_only=True)
class Advice:
    """The advised setting per rank and what the model predicts for it."""

    policy: str
    workers: int
    launch_cores: int | None  # None: `auto` (the roles' own CPUs) or not pinned (`none`)
    launch_set: int  # CPUs reserved for the launch roles (0 under `none`)
    cores: int
    throughput: float  # per rank, samples/s
    throughput_lo: float
    throughput_hi: float
    pred_lo: float  # interval of one run (adds the run-to-run scatter)
    pred_hi: float
    total_throughput: float  # all ranks
    bound: str  # "loader" or "compute"
    inflation: float
    grid: pd.DataFrame = field(repr=False, compare=False)
    # What the user acts on (an extrapolation, a budget below the fitted ones, the hand-off);
    # the fit's own notes are ``Fit.notes``, shown with the model's details.
    notes: tuple[str, ...] = ()
    handoff: str = Handoff.TORCH.value  # loader.handoff of the runs the model was fitted on


def launch_set_size(policy: str, launch_cores: int | None, *, roles: int) -> int:
    """CPUs the policy reserves for the launch roles (``pinning``'s launch set ``L``)."""
    if policy == Policy.NONE.value:
        return 0
    if policy == Policy.ISOLATED_MAIN.value:
        return max(1, launch_cores or 1)
    return max(roles, launch_cores or roles)


def candidate_grid(
    fit: mdl.Fit,
    *,
    cores: int,
    max_workers: int | None = None,
    policies: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Settings to evaluate: policy x workers x launch cores (``None`` = auto)."""
    chosen = list(policies) if policies is not None else list(fit.policies)
    unknown = sorted(set(chosen) - set(fit.policies))
    if unknown:
        raise mdl.ModelError(
            f"--policies {unknown}: not fitted; the model can predict {list(fit.policies)}"
        )
    top = max_workers if max_workers is not None else 2 * cores
    if top < 1:
        raise mdl.ModelError(f"--max-workers: got {top}, expected >= 1")
    roles = fit.node.roles(fit.node.combined_mode)
    rows = []
    for p in chosen:
        launch: list[int | None] = [None]
        if p != Policy.NONE.value:
            base = launch_set_size(p, None, roles=roles)
            launch += [base + i for i in range(1, EXTRA_LAUNCH_CORES + 1)]
        for lc in launch:
            for w in range(1, top + 1):
                rows.append({"policy": p, "workers": w, "launch_cores": lc, "cores": cores})
    return pd.DataFrame(rows)


def _below_budgets(fit: mdl.Fit, cores: int) -> list[str]:
    """A note when ``cores`` is below every budget the fit's runs had."""
    notes: list[str] = []
    if fit.budgets and cores < min(fit.budgets):
        # Measured on one H200 (docs/advisor.md, "Two core budgets", "Launch roles by their CPU
        # time"): whole cores 29-59 % low at 4-6 cores, CPU time still 10-15 % low at 3-5.
        why = (
            f"the per-core loader rate's change with the cores (gamma "
            f"{fit.params.core_exponent:.2f}) is extrapolated below the data runs' budgets"
            if fit.params.core_exponent != 0.0
            else "with the launch roles' measured CPU time the model was still 10-15 % low at "
            "3-5 cores on one H200 (its flat per-core loader rate; data runs at >= 3 budgets fit "
            "one that changes)"
            if fit.params.occupancy
            else "without the launch roles' CPU time in the tables the model charges each a "
            "whole core, which under-predicts a small budget"
        )
        notes.append(f"{cores} cores is below every fitted budget ({min(fit.budgets)}): {why}")
    return notes


def advise(
    fit: mdl.Fit,
    *,
    cores: int,
    max_workers: int | None = None,
    policies: Sequence[str] | None = None,
    tie: float = 0.01,
    prefer: Prefer = Prefer.HEADROOM,
    handoff: HandoffChoice | None = None,
) -> Advice:
    """The best setting for ``cores`` cores per rank; ``grid`` holds every evaluated one.
    ``handoff`` is how the fitted runs were chosen by hand-off (``choose_handoff``)."""
    if cores < 1:
        raise mdl.ModelError(f"--cores: got {cores}, expected >= 1")
    grid = mdl.predict(
        fit, candidate_grid(fit, cores=cores, max_workers=max_workers, policies=policies)
    )
    grid = grid[np.isfinite(grid["throughput"])].copy()
    if grid.empty:
        raise mdl.ModelError(
            f"--cores {cores}: the launch roles take every core; no setting leaves the loader one"
        )
    roles = fit.node.roles(fit.node.combined_mode)
    grid["launch_set"] = [
        launch_set_size(p, lc, roles=roles)
        for p, lc in zip(grid["policy"], grid["launch_cores"], strict=True)
    ]
    # Cores a setting occupies: its launch set and one per worker up to the loader's cores
    # (beyond them extra workers take no core of their own, they crowd the ones there are).
    grid["cores_used"] = grid["launch_set"] + np.minimum(grid["workers"], grid["loader_cores"])
    pick = best_setting(grid, tie, prefer)
    notes: list[str] = []
    lo_w, hi_w = min(fit.measured_workers), max(fit.measured_workers)
    if not lo_w <= int(pick["workers"]) <= hi_w:
        notes.append(
            f"{int(pick['workers'])} workers lies outside the measured {lo_w}..{hi_w}: "
            "an extrapolation; the verification runs test it"
        )
    if cores != fit.cores:
        notes.append(f"fitted on {fit.cores} cores per rank, advised for {cores}")
    notes += _below_budgets(fit, cores)
    chosen = handoff or HandoffChoice()
    notes += chosen.notes
    if (
        chosen.handoff == Handoff.TORCH.value
        and fit.node.pin_memory
        and fit.node.cuda
        and float(pick["inflation"]) > GIL_NOTE_INFLATION
    ):
        notes.append(
            f"compute {float(pick['inflation']):.2f}x slower with the loader, through torch's "
            "DataLoader with pinned memory: its pin-memory thread holds the rank's GIL "
            "(docs/results-gil.md); measure loader.handoff: ring, which removed the inflation "
            "on one H200 (docs/results-handoff.md), and advise on those runs"
        )
    notes += nice_note(chosen.handoff, pick)
    lc = pick["launch_cores"]
    return Advice(
        policy=str(pick["policy"]),
        workers=int(pick["workers"]),
        launch_cores=None if lc is None or pd.isna(lc) else int(lc),
        launch_set=int(pick["launch_set"]),
        cores=cores,
        throughput=float(pick["throughput"]),
        throughput_lo=float(pick["throughput_lo"]),
        throughput_hi=float(pick["throughput_hi"]),
        pred_lo=float(pick["pred_lo"]),
        pred_hi=float(pick["pred_hi"]),
        total_throughput=float(pick["total_throughput"]),
        bound=str(pick["bound"]),
        inflation=float(pick["inflation"]),
        grid=grid.reset_index(drop=True),
        notes=tuple(notes),
        handoff=chosen.handoff,
    )


def nice_note(handoff: str, pick: pd.Series) -> list[str]:
    """With the ring, workers that outnumber the loader's cores preempt the launch roles; at
    nice 19 they no longer do (measured under ``none`` and ``isolated-main``,
    docs/results-handoff.md). Torch's loader gets no such note: its inflation is the GIL's,
    which the workers' priority leaves alone."""
    workers, cores = int(pick["workers"]), float(pick["loader_cores"])
    if handoff != Handoff.RING.value or not workers > cores:  # NaN: no loader core at all
        return []
    return [
        f"{workers} workers outnumber the loader's {cores:.3g} cores: run them with "
        "loader.worker_nice: 19, so that they stop preempting the launch roles (24 ring "
        "workers on 16 cores of one H200: compute inflation +7.8 % -> +3.7 % under none, "
        "+16.0 % -> +1.6 % under isolated-main, docs/results-handoff.md); the model was "
        "fitted at the runs' own nice"
    ]


#: Above this compute inflation of the advised setting under torch's pinned loader, the advice
#: points at the ring hand-off: +5 %, the inflation the ring left at 12 workers on one H200 had
#: its interval's upper end below it (docs/results-handoff.md).
GIL_NOTE_INFLATION = 1.05


@dataclass(frozen=True, kw_only=True)
class HandoffChoice:
    """Which hand-off's runs the model is fitted on, and why (``choose_handoff``)."""

    handoff: str = Handoff.TORCH.value
    notes: tuple[str, ...] = ()


def _handoff_of(runs: pd.DataFrame) -> pd.Series:
    """Each run's hand-off: the column, ``torch`` where a table predates it; empty (None) for
    the modes that do not load (their twins serve every hand-off)."""
    loads = runs["mode"].isin((mdl.LOADER_MODE, *mdl.COMBINED_MODES))
    col = runs["handoff"] if "handoff" in runs else pd.Series(None, index=runs.index)
    return col.where(~loads | col.notna(), Handoff.TORCH.value).where(loads, None)


def choose_handoff(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    handoff: str | None = None,
    combined_mode: str | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, HandoffChoice]:
    """The runs (and their steps) of one hand-off, the twins with them: ``handoff`` if given,
    else the one whose best measured combined setting delivers the most samples/s per rank.
    One model describes one hand-off: the ring removes the GIL wait that torch's loader adds,
    so their runs pooled would fit neither."""
    of = _handoff_of(runs)
    present = sorted({str(h) for h in of.dropna()})
    if handoff is not None and handoff not in present:
        raise mdl.ModelError(
            f"--handoff {handoff!r}: no loading run with it; the tables hold {present}"
        )
    if len(present) <= 1 and handoff is None:
        return runs, steps, HandoffChoice(handoff=present[0] if present else Handoff.TORCH.value)

    def subset(h: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        keep = runs[(of == h) | of.isna()]
        return keep, steps[steps["run_id"].isin(keep["run_id"])]

    best: dict[str, float] = {}
    for h in present:
        try:
            data = mdl.run_data(*subset(h), combined_mode=combined_mode)
        except mdl.ModelError:
            continue  # no combined run of this hand-off the model could use
        best[h] = best_measured(data).throughput
    if not best:
        raise mdl.ModelError(f"no hand-off of {present} has combined runs the model can fit")
    chosen = handoff if handoff is not None else max(best, key=lambda h: best[h])
    others = ", ".join(f"{h} {v:.0f}" for h, v in sorted(best.items()) if h != chosen)
    note = (
        f"loader.handoff {chosen}: the model is fitted on its runs only (best measured setting "
        f"{best.get(chosen, float('nan')):.0f} samples/s per rank; {others or 'no other'}"
        + ("; chosen by --handoff)" if handoff is not None else "; the best of them)")
    )
    keep_runs, keep_steps = subset(chosen)
    return keep_runs, keep_steps, HandoffChoice(handoff=chosen, notes=(note,))


def best_setting(grid: pd.DataFrame, tie: float, prefer: Prefer = Prefer.HEADROOM) -> pd.Series:
    """The row of ``grid`` with the highest throughput, where rows within ``tie`` (relative) of
    it are equal and ``prefer`` picks among them (``Prefer``)."""
    best = float(grid["throughput"].max())
    near = grid[grid["throughput"] >= best * (1 - tie)].copy()
    if prefer is Prefer.FEWEST_CORES:
        keys = ["cores_used", "workers", "launch_set", "throughput"]
    else:
        # Whole cores of the loader's share a setting leaves without a worker: 0 at c_L and
        # beyond. Whole: with the roles' measured CPU time c_L is fractional (14.5 of 16), and
        # a worker for the half core would be one more than the cores (docs/advisor.md).
        whole = np.floor(near["loader_cores"].astype(float) + 1e-9)
        near["headroom_gap"] = np.maximum(0, whole - near["workers"])
        keys = ["launch_set", "headroom_gap", "workers", "throughput"]
    # Ascending but the last key: of equal settings, the higher prediction.
    return near.sort_values(keys, ascending=[True, True, True, False], kind="stable").iloc[0]


def compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    """Every way to write ``total`` as ``parts`` positive integers, in order."""
    if parts == 1:
        return [(total,)] if total >= 1 else []
    return [
        (first, *rest)
        for first in range(1, total - parts + 2)
        for rest in compositions(total - first, parts - 1)
    ]


def advise_split(
    fits: Sequence[mdl.Fit], *, cores: int, tie: float = 0.01
) -> tuple[list[int], pd.DataFrame]:
    """Cores per job for jobs sharing a node of ``cores`` (A-Dloader's question), each job at
    its own advised setting for its share.

    The score of a split is the sum over jobs of the predicted throughput relative to the job's
    best on the whole node (jobs of different models count samples of different cost, so raw
    samples/s would favour the cheapest model); splits within ``tie`` of the best count as
    equal and the one closest to even wins. A share that leaves a job's loader no core scores
    0 for that job. Returns the counts and every split scored (``score``, ``rel_<i>``)."""
    if len(fits) < 2:
        raise mdl.ModelError(f"{len(fits)} fitted job(s): a split needs >= 2")
    if cores < len(fits):
        raise mdl.ModelError(f"--cores {cores}: fewer than the {len(fits)} jobs")
    best = [advise(f, cores=cores, tie=tie).throughput for f in fits]
    memo: dict[tuple[int, int], float] = {}

    def relative(i: int, c: int) -> float:
        if (i, c) not in memo:
            try:
                memo[(i, c)] = advise(fits[i], cores=c, tie=tie).throughput / best[i]
            except mdl.ModelError:
                memo[(i, c)] = 0.0
        return memo[(i, c)]

    even = cores / len(fits)
    rows = []
    for split in compositions(cores, len(fits)):
        rel = [relative(i, c) for i, c in enumerate(split)]
        rows.append(
            {
                "split": split,
                "score": sum(rel),
                "distance_from_even": sum(abs(c - even) for c in split),
                **{f"rel_{i}": r for i, r in enumerate(rel)},
            }
        )
    table = pd.DataFrame(rows)
    near = table[table["score"] >= table["score"].max() * (1 - tie)]
    pick = near.sort_values(["distance_from_even", "score"], ascending=[True, False]).iloc[0]
    return list(pick["split"]), table


@dataclass(frozen=True, kw_only=True)
class MeasuredSetting:
    """A combined setting of the fitted runs and its mean measured throughput per rank."""

    policy: str
    workers: int
    launch_cores: int | None  # None: `auto` or not pinned
    throughput: float
    runs: int


def best_measured(data: mdl.RunData) -> MeasuredSetting:
    """The combined setting with the highest mean throughput per rank among the runs the model
    was fitted on (``data``: the CUPTI-traced ones already left out), as the fit sees them
    (``model.group_stats``)."""
    groups = mdl.group_stats(data)
    combined = groups[groups["mode"] == data.node.combined_mode]
    top = combined.sort_values("throughput", ascending=False).iloc[0]
    policy, launch = str(top["policy"]), top["launch_cores"]
    return MeasuredSetting(
        policy=policy,
        workers=int(top["workers"]),
        # `none` stores a launch_cores it never reads; the advice has None there, as for auto.
        launch_cores=None if policy == Policy.NONE.value or pd.isna(launch) else int(launch),
        throughput=float(top["throughput"]),
        runs=int(top["runs"]),
    )


#: How ``efficiency_lines`` names a part of the lost time.
_PART_WORDS = {
    "data_wait": "data wait",
    "copy": "host-to-device copy",
    "compute": "compute inflation",
    "launch_delay": "host launch delay",
    "unattributed": "unattributed",
}


def efficiency_lines(runs: pd.DataFrame, best: MeasuredSetting, *, mode: str) -> list[str]:
    """The measured pipeline efficiency of ``best`` (its ``mode`` runs in a runs table with
    ``codl.analysis.efficiency``'s columns): throughput over the roofline of each block, over
    blocks, with the part that is the roofline and the biggest part of the lost time. None
    where the runs have no efficiency (no data-alone twin in their blocks)."""
    need = {"efficiency", "block", "mode", "policy", "workers"}
    if not need <= set(runs):
        return []
    sel = runs[
        (runs["mode"].astype(str) == mode)
        & (runs["policy"].astype(str) == best.policy)
        & (pd.to_numeric(runs["workers"], errors="coerce") == best.workers)
    ]
    if best.launch_cores is not None and "launch_cores" in sel:
        sel = sel[pd.to_numeric(sel["launch_cores"], errors="coerce") == best.launch_cores]
    sel = sel[np.isfinite(pd.to_numeric(sel["efficiency"], errors="coerce"))]
    if sel.empty:
        return []
    sel = sel.assign(block=sel["block"].fillna("").astype(str), setting=0)
    row = eff.efficiency_over_blocks(sel, ["setting"]).iloc[0]
    value = f"{row['efficiency']:.2f}"
    if math.isfinite(row["efficiency_lo"]):
        value += f" (95 % interval {row['efficiency_lo']:.2f} to {row['efficiency_hi']:.2f})"
    # "data", or "data (3 of 4 blocks)" where blocks disagree.
    limiting, _, split = str(row["limiting_part"]).partition(" ")
    part = str(row["biggest_part"])
    roofline = (
        f"its roofline differs between blocks {split}"
        if limiting == eff.MIXED
        else f"its roofline is {limiting} alone{' ' + split if split else ''}"
    )
    lines = [
        f"measured pipeline efficiency of the best setting measured: {value} over "
        f"{_count(int(row['n_blocks']), 'block')}, at {row['throughput_samples_s']:.0f} "
        f"samples/s against a roofline of {row['roofline_samples_s']:.0f} (the slower of data "
        f"alone and compute alone of each block)",
        f"{roofline}: {row['over_data']:.2f}x data alone, {row['over_compute']:.2f}x compute alone",
    ]
    if part:
        lines.append(
            f"time lost per step against the roofline: {row['lost_ms']:.1f} ms, the most of it "
            f"{_PART_WORDS.get(part, part)} ({row[f'lost_{part}_ms']:.1f} ms)"
        )
    return lines


def _best_experiment(best: MeasuredSetting, modes: list[str], repeats: int) -> dict[str, Any]:
    return {
        "name": "best",
        "base": {
            "pinning": _pinning(best.policy, best.launch_cores),
            "loader": {"workers": best.workers},
        },
        "factors": {"mode": modes},
        "repeats": repeats,
    }


def _is_advice(best: MeasuredSetting, advice: Advice, workers: Sequence[int]) -> bool:
    """The best measured setting is already among the advice experiment's runs."""
    return (
        best.policy == advice.policy
        and best.launch_cores == advice.launch_cores
        and best.workers in workers
    )


def _pinning(policy: str, launch_cores: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"policy": policy}
    if launch_cores is not None and policy != Policy.NONE.value:
        out["launch_cores"] = launch_cores
    return out


def _verify_defaults(
    defaults: Mapping[str, Any], advice: Advice, measured_steps: int | None
) -> dict[str, Any]:
    """The verification config's defaults: the fitted runs' with a new seed, the advice's
    hand-off, and the experiments' own pinning keys left to them."""
    d = copy.deepcopy(dict(defaults))
    d.pop("mode", None)
    if measured_steps is not None:
        # Results measured with few steps (the 30-step H200 set) deserve a verification with
        # enough steps for the comparison to mean something (config/README.md).
        d.setdefault("steps", {})["measured"] = measured_steps
    # A verification run with the spec of a fitted run would have its run id, and the workflow
    # would reuse that run: a new seed makes every verification run a new measurement.
    d["seed"] = int(d.get("seed", 0)) + VERIFY_SEED_OFFSET
    if advice.handoff != Handoff.TORCH.value:
        d.setdefault("loader", {})["handoff"] = advice.handoff
    if "pinning" in d:
        # The experiments set policy and launch cores; other pinning keys (helper placement)
        # stay as the measured runs had them.
        d["pinning"] = {
            k: v for k, v in d["pinning"].items() if k not in ("policy", "launch_cores")
        }
    return d


def verification_config(
    advice: Advice,
    fit: mdl.Fit,
    *,
    defaults: Mapping[str, Any],
    slurm: Mapping[str, Any] | None = None,
    worker_step: int = 2,
    repeats: int = 3,
    measured_steps: int | None = None,
    best: MeasuredSetting | None = None,
) -> dict[str, Any]:
    """A config (config/README.md format) that re-runs the advice and its neighbours.

    Experiments: ``advice`` (the advised policy and launch cores at workers - step, workers,
    workers + step, with its compute twin), ``policies`` (every other fitted policy at the
    advised workers, with their twins), ``best`` (the best setting measured in the fitted runs,
    ``best``, unless the advice is that setting: "within x % of the best measured" is then
    measured side by side, not against another day's runs) and ``loader`` (data mode at the same
    worker counts), so that the model can be refitted on the verification runs and its
    prediction compared.
    """
    if worker_step < 1 or repeats < 1:
        raise mdl.ModelError(
            f"--worker-step {worker_step}, --repeats {repeats}: expected both >= 1"
        )
    mode = fit.node.combined_mode
    twin = mdl.COMPUTE_TWIN[mode]
    w = advice.workers
    workers = sorted({x for x in (w - worker_step, w, w + worker_step) if x >= 1})
    d = _verify_defaults(defaults, advice, measured_steps)
    experiments: list[dict[str, Any]] = [
        {
            "name": "advice",
            "base": {"pinning": _pinning(advice.policy, advice.launch_cores)},
            "factors": {"mode": [mode, twin], "loader.workers": workers},
            "repeats": repeats,
        }
    ]
    others = [p for p in fit.policies if p != advice.policy]
    if others:
        experiments.append(
            {
                "name": "policies",
                "base": {"loader": {"workers": w}},
                "factors": {"mode": [mode, twin], "pinning.policy": others},
                "repeats": repeats,
            }
        )
    if best is not None and not _is_advice(best, advice, workers):
        experiments.append(_best_experiment(best, [mode, twin], repeats))
    experiments.append(
        {
            "name": "loader",
            "factors": {
                "mode": [mdl.LOADER_MODE],
                "pinning.policy": [Policy.NONE.value],
                "loader.workers": workers,
            },
            "repeats": repeats,
        }
    )
    cfg: dict[str, Any] = {"defaults": d, "experiments": experiments}
    s = dict(slurm or {})
    s["cpus_per_rank"] = advice.cores
    cfg["slurm"] = s
    return cfg


def describe_launch(advice: Advice) -> str:
    if advice.launch_set == 0:
        return "launch roles not pinned"
    lc = "auto" if advice.launch_cores is None else str(advice.launch_cores)
    return f"launch_cores {lc} ({advice.launch_set} launch CPUs)"


def render_config(cfg: Mapping[str, Any], advice: Advice, source: str) -> str:
    header = (
        f"# Verification of `codl advise {source}` (docs/advisor.md): the advice and its\n"
        f"# neighbours, re-run. Advice per rank on {advice.cores} cores: policy {advice.policy},\n"
        f"# {advice.workers} workers, {describe_launch(advice)}, loader.handoff {advice.handoff};\n"
        f"# predicted {advice.throughput:.0f} samples/s per rank "
        f"[{advice.throughput_lo:.0f}, {advice.throughput_hi:.0f}] (model), "
        f"[{advice.pred_lo:.0f}, {advice.pred_hi:.0f}] (one run), {advice.bound}-bound.\n"
    )
    return header + yaml.dump(
        dict(cfg), Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=None
    )


class _NoAliasDumper(yaml.SafeDumper):
    """A config is read by people: repeated lists are written out, not as YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def defaults_from_runs(runs: pd.DataFrame, mode: str) -> dict[str, Any]:
    """Run-spec defaults rebuilt from the runs table, for a results dir without its config."""
    row = runs[runs["mode"] == mode].iloc[0]

    def put(out: dict[str, Any], section: str, key: str, column: str) -> None:
        if column in row and pd.notna(row[column]):
            value = row[column]
            value = value.item() if isinstance(value, np.generic) else value
            out.setdefault(section, {})[key] = value

    out: dict[str, Any] = {}
    if "device" in row and pd.notna(row["device"]):
        out["device"] = str(row["device"])
    for key in ("model", "batch_size", "image_size", "precision"):
        put(out, "workload", key, key)
    for key in ("prefetch_factor", "pin_memory", "handoff"):
        put(out, "loader", key, key)
    for key in ("nodes", "ranks_per_node", "backend"):
        put(out, "layout", key, key)
    if "prefetch_factor" in out.get("loader", {}):
        out["loader"]["prefetch_factor"] = int(out["loader"]["prefetch_factor"])
    return out


# ---------------------------------------------------------------------------------------------
# The gain: the advice against the best setting measured


@dataclass(frozen=True, kw_only=True)
class Gain:
    """What the advice is predicted to gain over the best setting the fitted runs measured,
    both predicted on the advice's budget (``predicted_gain``)."""

    best: MeasuredSetting
    same: bool  # the advice is that setting, on the budget it was measured on
    gain: float  # predicted(advice) / predicted(best) - 1
    lo: float  # 95 % interval over the bootstrap replicates, paired; NaN without them
    hi: float
    cores: int  # the budget both are predicted on
    measured_cores: int  # the budget the fitted runs had
    predicted_best: float  # the model's throughput per rank of ``best`` on ``cores``
    workers: int  # the advice's


def predicted_gain(fit: mdl.Fit, advice: Advice, best: MeasuredSetting) -> Gain | None:
    """The advice's predicted gain over ``best`` (``best_measured``), or None where the model
    cannot predict ``best`` (a policy it did not fit). The interval pairs the two predictions
    replicate by replicate: the errors they share (the loader's rate, the compute capacity)
    cancel, so the gain is narrower than the two intervals side by side would say."""
    if best.policy not in fit.policies:
        return None
    settings = pd.DataFrame(
        {
            "policy": [advice.policy, best.policy],
            "workers": [advice.workers, best.workers],
            "launch_cores": [advice.launch_cores, best.launch_cores],
            "cores": [advice.cores, advice.cores],
        }
    )
    point = mdl.predict(replace(fit, boot=()), settings)["throughput"].to_numpy()
    draws = mdl.predict_draws(fit, settings)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = draws[:, 0] / draws[:, 1] - 1
    ratios = ratios[np.isfinite(ratios)]
    lo, hi = np.percentile(ratios, [2.5, 97.5]) if len(ratios) else (np.nan, np.nan)
    same = (
        (best.policy, best.workers, best.launch_cores)
        == (advice.policy, advice.workers, advice.launch_cores)
    ) and advice.cores == fit.cores
    return Gain(
        best=best,
        same=same,
        gain=float(point[0] / point[1] - 1),
        lo=float(lo),
        hi=float(hi),
        cores=advice.cores,
        measured_cores=fit.cores,
        predicted_best=float(point[1]),
        workers=advice.workers,
    )


# ---------------------------------------------------------------------------------------------
# The advice as text: what `codl advise` prints and advice.txt holds

#: An interval wider than this many times its value (or the parameter's scale, for one that may
#: be 0) is not shown as a result: [0.3, 2.3] around 0.8 already spans a factor of 7, and the
#: refits of an unidentified parameter spread over orders of magnitude ([0, 1.15e4] for a `k`
#: that no combined run set). Such a number is said to be "not determined by these runs".
WIDE = 2.0
#: The scale of parameters that may be 0, so that [0, 0.05] around 0 is a bound, not a spread:
#: inflation coefficients in units of the compute time alone, the exponent in units of 1; the
#: hand-off is measured against the step (``_scale``).
_SCALE = {"k0": 0.1, "k": 0.1, "core_exponent": 0.1}
#: A relative gain whose interval is wider than WIDE x this says nothing about the advice.
_GAIN_SCALE = 0.25
#: What each parameter of ``Fit.parameters`` is, for a reader of the details.
PARAMETER_WORDS = {
    "rate": "samples/s one loader worker delivers",
    "kappa": "loader workers one core keeps busy",
    "ceiling": "the most samples/s the loader delivers, whatever its cores",
    "core_exponent": "how a core's share of the loader changes with fewer cores",
    "compute": "samples/s the rank computes with no loader running",
    "compute_ms": "ms of compute per step with no loader running",
    "k0": "compute slowdown a running loader causes (0.3: 30 % slower)",
    "k": "further slowdown per runnable worker beyond the loader's cores, per core",
    "handoff_ms": "ms per step spent handing the batch over, outside compute",
}
DETAILS_RULE = "=" * 30 + " details: the model behind the advice " + "=" * 30
DETAILS_HINT = (
    "the model behind the advice (its parameters, their intervals, the fit's notes): --details"
)


def undetermined(value: float, lo: float, hi: float, *, scale: float = 0.0) -> str:
    """Why the interval ``[lo, hi]`` of ``value`` says nothing (``WIDE``), or "" when it does."""
    if math.isnan(lo) or math.isnan(hi):
        return "no refit identified it"
    if math.isinf(lo) or math.isinf(hi):
        return "some refits leave it unbounded"
    if hi - lo > WIDE * max(abs(value), scale):
        if abs(value) >= scale:
            return f"the refits spread it wider than {WIDE:g}x its value"
        return f"the refits spread it wider than {WIDE * scale:.3g}"
    return ""


def _number(v: float, fmt: str) -> str:
    return "none" if math.isinf(v) else format(v, fmt)


def interval_words(value: float, lo: float, hi: float, *, fmt: str, scale: float = 0.0) -> str:
    """``lo to hi``, or that these runs do not determine it, why, and the refits' range."""
    why = undetermined(value, lo, hi, scale=scale)
    span = f"{_number(lo, fmt)} to {_number(hi, fmt)}"
    if not why:
        return span
    refits = "" if math.isnan(lo) or math.isnan(hi) else f": {span}"
    return f"not determined by these runs ({why}{refits})"


def snakemake_command(config: Path) -> str:
    """The command that runs a config from the checkout's root (config/loop-cpu.yaml's
    header), as a user types it."""
    return f"snakemake --profile profiles/local --configfile {shlex.quote(str(config))}"


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def verify_lines(
    config: Path | None,
    *,
    command: str,
    repeats: int,
    predictions: Path | None = None,
) -> list[str]:
    """How to verify the advice: ``command`` runs ``config`` (the verification config written;
    None: not asked for, and ``command`` runs the config the hint asks to write)."""
    each = f"{_count(repeats, 'repeat')} each"
    if config is None:
        return [
            "to verify it: add `--out verify.yaml` to this command; the config it writes "
            f"re-runs the advice and its neighbours ({each}); run it:",
            f"  {command}",
        ]
    scored = (
        f", and compares what they measure with the predictions in {predictions}"
        if predictions
        else ""
    )
    return [
        f"to verify it: {config} re-runs the advice and its neighbours ({each}){scored}; run it:",
        f"  {command}",
    ]


def _pct(v: float) -> str:
    return f"{100 * v:+.1f} %"


#: A predicted gain within this of 0, interval and all, is "none": the model puts the advice
#: and the best measured setting on one plateau (the tie rule picked between them).
_NO_GAIN = 0.005


def gain_line(gain: Gain | None) -> str:
    """The advice's predicted gain over the best setting measured, in words."""
    if gain is None:
        return (
            "predicted gain: not computed: the best setting measured has a policy the model "
            "did not fit"
        )
    b = gain.best
    measured = f"measured {b.throughput:.0f} samples/s per rank, mean of {_count(b.runs, 'run')}"
    if gain.same:
        return f"predicted gain: none: the advice is the best setting measured ({measured})"
    launch = "" if b.launch_cores is None else f", launch_cores {b.launch_cores}"
    on = f" on {gain.cores} cores" if gain.cores != gain.measured_cores else ""
    best = (
        f"the best setting measured (policy {b.policy}, {b.workers} workers{launch}: "
        f"predicted {gain.predicted_best:.0f}{on}, {measured})"
    )
    ends = [gain.gain] if math.isnan(gain.lo) else [gain.gain, gain.lo, gain.hi]
    if max(abs(v) for v in ends) < _NO_GAIN:
        fewer = gain.best.workers - gain.workers
        uses = (
            f"; the advice uses {_count(abs(fewer), 'worker')} {'fewer' if fewer > 0 else 'more'}"
            if fewer
            else ""
        )
        return (
            f"predicted gain: none over the best setting measured (policy {b.policy}, "
            f"{b.workers} workers{launch}): the model predicts both at "
            f"{gain.predicted_best:.0f} samples/s per rank{on} (that setting {measured}){uses}"
        )
    if math.isnan(gain.lo):
        return f"predicted gain: {_pct(gain.gain)} over {best}"
    why = undetermined(gain.gain, gain.lo, gain.hi, scale=_GAIN_SCALE)
    if why:
        return (
            f"predicted gain: {_pct(gain.gain)} over {best}; its interval is not determined by "
            f"these runs ({why}: {_pct(gain.lo)} to {_pct(gain.hi)})"
        )
    tell = "; the runs cannot tell it from no gain" if gain.lo <= 0 <= gain.hi else ""
    return (
        f"predicted gain: {_pct(gain.gain)} (95 % interval {_pct(gain.lo)} to "
        f"{_pct(gain.hi)}) over {best}{tell}"
    )


def _bound_words(advice: Advice) -> str:
    if advice.bound == "loader":
        return "limited by the loader (compute waits for batches)"
    return "limited by compute (the loader keeps up)"


def prediction_line(advice: Advice, *, boot: bool, run_cv: float) -> str:
    """The predicted throughput of the advice with its intervals in words: the model's (its
    bootstrap) and a single run's (also the repeats' scatter, ``run_cv``)."""
    x = advice.throughput
    total = f" ({advice.total_throughput:.0f} in all)" if advice.total_throughput != x else ""
    head = f"predicted: {x:.0f} samples/s per rank{total}, {_bound_words(advice)}"
    if not boot:
        return f"{head}; no interval (--boot 0 draws no bootstrap)"
    lo, hi, one_lo, one_hi = (
        advice.throughput_lo,
        advice.throughput_hi,
        advice.pred_lo,
        advice.pred_hi,
    )
    why = undetermined(x, lo, hi)
    if why:
        return f"{head}; its interval {interval_words(x, lo, hi, fmt='.0f')}"
    line = f"{head}; 95 % interval {lo:.0f} to {hi:.0f}"
    if undetermined(x, one_lo, one_hi):
        return (
            f"{line}; a single run's is not determined by these runs (the repeats of a "
            f"setting scatter by {100 * run_cv:.0f} %, relative SD: {one_lo:.0f} to {one_hi:.0f})"
        )
    return f"{line}, a single run {one_lo:.0f} to {one_hi:.0f}"


def summary_text(
    advice: Advice,
    *,
    boot: bool,
    run_cv: float,
    gain: Gain | None,
    verify: Sequence[str],
    notes: Sequence[str] = (),
) -> str:
    """The advice as a newcomer reads it: the setting and its predicted gain, the command that
    verifies it (``verify_lines``), the notes to act on (``advice.notes``, then ``notes``)."""
    lines = [
        f"advice for {advice.cores} cores per rank: policy {advice.policy}, "
        f"{advice.workers} workers, {describe_launch(advice)}, loader.handoff {advice.handoff}",
        prediction_line(advice, boot=boot, run_cv=run_cv),
        gain_line(gain),
        "",
        *verify,
    ]
    every = [*advice.notes, *notes]
    if every:
        lines += ["", "notes:", *(f"- {n}" for n in every)]
    return "\n".join(lines) + "\n"


def _scale(fit: mdl.Fit, parameter: str, policy: str) -> float:
    if parameter == "handoff_ms":
        # A tenth of the step: [0, 30 ms] around 0 with 30 ms steps says nothing.
        return 0.1 * float(fit.params.compute_ms.get(policy, 0.0))
    return _SCALE.get(parameter, 0.0)


def parameters_text(fit: mdl.Fit) -> str:
    """The fitted parameters with their 95 % intervals in words (``interval_words``), and what
    each one is."""
    params = fit.parameters()
    rows = [("parameter", "policy", "value", "95 % interval over the refits")]
    for r in params.to_dict("records"):
        value, lo, hi = float(r["value"]), float(r["lo"]), float(r["hi"])
        name, policy = str(r["parameter"]), str(r["policy"])
        scale = _scale(fit, name, policy)
        shown = interval_words(value, lo, hi, fmt=".4g", scale=scale) if fit.boot else "-"
        rows.append((name, policy, format(value, ".4g"), shown))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    table = [
        f"{a.rjust(widths[0])}  {b.ljust(widths[1])}  {c.rjust(widths[2])}  {d}".rstrip()
        for a, b, c, d in rows
    ]
    if any(row[3].startswith("not determined") for row in rows):
        table.append(
            f"not determined: some refits leave it unbounded, or its interval is wider than "
            f"{WIDE:g}x the value (and than {WIDE:g}x 0.1 for k0 and k, {WIDE:g}x a tenth of the "
            "step for handoff_ms): these runs do not pin it"
        )
    meaning = [f"  {p}: {PARAMETER_WORDS[p]}" for p in dict.fromkeys(params["parameter"])]
    return "\n".join([*table, 'what they are (docs/advisor.md, "Equations"):', *meaning])


def details_text(
    advice: Advice, fit: mdl.Fit, *, tie: float, prefer: Prefer = Prefer.HEADROOM
) -> str:
    """The model behind the advice: its parameters, the advice's operating point, the best
    setting per policy and the fit's notes."""
    boot = bool(fit.boot)
    refits = f", {len(fit.boot)} bootstrap refits" if boot else ", no bootstrap (--boot 0)"
    lines = [
        f"model fitted on {fit.cores} cores per rank ({fit.node.combined_mode}, "
        f"{fit.node.world} rank(s)){refits}:",
        parameters_text(fit),
        "",
        f"advised setting: {advice.bound}-bound, compute inflation {advice.inflation:.3f} "
        f"(compute {advice.inflation:.2f}x as slow as alone), {advice.launch_set} launch "
        f"CPU(s), {advice.total_throughput:.0f} samples/s in all",
    ]
    best = pd.DataFrame(
        [best_setting(g, tie, prefer) for _, g in advice.grid.groupby("policy", sort=True)]
    )
    cols = ["policy", "workers", "launch_set", "throughput"]
    cols += ["throughput_lo", "throughput_hi"] if boot else []
    lines += [
        "",
        "best per policy (same tie rule):",
        best[cols].to_string(index=False, float_format=lambda v: f"{v:.0f}"),
    ]
    if fit.notes:
        lines += ["", "fit notes:", *(f"- {n}" for n in fit.notes)]
    return "\n".join(lines) + "\n"
