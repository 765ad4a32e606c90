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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from codl.advisor import model as mdl
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
    notes = list(fit.notes)
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
# CLI


def print_advice(
    advice: Advice, fit: mdl.Fit, out: Path | None, tie: float, prefer: Prefer = Prefer.HEADROOM
) -> None:
    # Without bootstrap replicates (--boot 0) an interval would be the point twice: a
    # zero-width "95 %" interval that claims a certainty nothing measured; none is shown.
    boot = bool(fit.boot)
    print(
        f"model fitted on {fit.cores} cores per rank ({fit.node.combined_mode}, "
        f"{fit.node.world} rank(s)); parameters"
        + (" with 95 % bootstrap intervals:" if boot else " (no bootstrap: no intervals):")
    )
    params = fit.parameters() if boot else fit.parameters().drop(columns=["lo", "hi"])
    print(params.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    intervals = (
        f" [{advice.throughput_lo:.0f}, {advice.throughput_hi:.0f}] (model), "
        f"[{advice.pred_lo:.0f}, {advice.pred_hi:.0f}] (one run)"
        if boot
        else " (no interval: --boot 0)"
    )
    print(
        f"\nadvice for {advice.cores} cores per rank: policy {advice.policy}, "
        f"{advice.workers} workers, {describe_launch(advice)}, loader.handoff {advice.handoff}\n"
        f"predicted {advice.throughput:.0f} samples/s per rank{intervals}; "
        f"{advice.total_throughput:.0f} samples/s in all; {advice.bound}-bound, "
        f"compute inflation {advice.inflation:.3f}"
    )
    best = pd.DataFrame(
        [best_setting(g, tie, prefer) for _, g in advice.grid.groupby("policy", sort=True)]
    )
    print("\nbest per policy (same tie rule):")
    cols = ["policy", "workers", "launch_set", "throughput"]
    cols += ["throughput_lo", "throughput_hi"] if boot else []
    print(best[cols].to_string(index=False, float_format=lambda v: f"{v:.0f}"))
    for note in advice.notes:
        print(f"note: {note}")
    if out is not None:
        print(f"\nverification config: {out}")
