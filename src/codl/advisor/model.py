"""Throughput model of a training pipeline: loader capacity, compute capacity, interference.

Fitted from isolation runs (``data`` at >= 2 worker counts, ``compute`` or ``compute+comm``)
plus a few combined runs (``data+compute`` or ``combined``) of one node; predicts the combined
throughput and the compute inflation of any worker count, policy and core budget on that node.
Pure functions: DataFrames in, dataclasses and DataFrames out; nothing here reads files or draws.

Everything is per rank (a rank has its own loader and its own ``c`` cores: the CPUs its trace says
it had, runs.csv ``cpus``, else the fit's ``cores``); a run's throughput is
``batch x 1000 / mean step_ms`` over all its measured steps (what ``summarize`` reports, divided
by the world size).

Equations (docs/advisor.md explains the choices):

- Launch roles busy in a rank: ``a = 1`` (main thread) ``+ 1`` (autograd: CUDA and compute)
  ``+ 1`` (pin-memory: CUDA, a loader, ``pin_memory``) ``+ 1`` (comm: world size > 1), as
  ``pinning.roles_for`` counts them.
- Launch CPUs the policy reserves: ``n = 0`` under ``none`` and ``shared`` (workers may run
  anywhere), ``n = 1`` under ``isolated-main``, ``n = max(a, launch_cores)`` under
  ``isolated``, ``spread`` and ``numa``.
- Cores left to the loader: where the steps table has the launch roles' on-CPU time per step
  (``launch_run_ms`` and the helpers' ``*_run_ms``, from the scheduler samples), the roles
  occupy ``u = tau * X / 1000`` cores at throughput ``X``, ``tau`` their CPU ms per sample
  (fitted per mode: a ``data`` rank's main thread only consumes). Unpinned (``none``,
  ``shared``) they take that from the loader's cores, ``c_L(X) = c - tau * X / 1000``; under
  ``isolated-main`` the helpers do (``c_L = c - n - tau_helpers * X / 1000``); a fenced policy
  reserves its launch set whatever the roles use (``c_L = c - n``). Without those columns each
  role counts a whole core: ``c_L = c - max(a, n)``.
- Loader capacity (samples/s): ``X_L(w) = min(X_W, M)`` with ``X_W = r * min(w, kappa * c_L)``:
  each worker delivers ``r`` samples/s until the loader's cores run out; ``kappa`` is the number
  of worker-equivalents one core sustains (< 1 when collation, IPC and the consuming thread cost
  CPU beyond the workers' per-item work, or workers contend for memory bandwidth); ``M`` is a
  ceiling no core adds to (the main process collating and consuming, the pin-memory thread).
  Fitted from ``data`` runs; ``M`` only from runs at >= 2 core budgets (``inf`` otherwise: at
  one budget the two plateaus predict the same runs, and the fit reads it as the cores').
- Few cores: a core's worker-equivalents may change with the loader's cores, ``kappa *
  (c_L / c_ref) ** gamma`` (``c_ref`` the data runs' largest budget; ``gamma > 0``: a core
  sustains less on fewer cores), so ``X_W = r * min(w, kappa * c_L * (c_L / c_ref) ** gamma)``.
  ``gamma`` is fitted only from data runs at >= 3 core budgets (two place ``M``); else 0, noted.
- Compute capacity (samples/s): ``C_p = batch * 1000 / mean step_ms`` of the policy's compute
  runs (``compute`` for ``data+compute``, ``compute+comm`` for ``combined``).
- Runnable loader demand at throughput ``X``: ``D = w * X / X_W(w)`` (workers block when their
  prefetch slots are full, so a loader delivering a fraction of what its workers can keeps that
  fraction of its workers runnable; at the ceiling ``M`` they wait for the consumer).
- Overload: ``O = max(0, D - c_L) / c``: runnable workers beyond the loader's cores, relative to
  the node's cores. Under ``none`` and ``shared`` they spill onto the launch roles' cores (the
  published preemption mechanism); under fenced policies they crowd their own cores and the
  helpers placed there. Hence one coefficient per policy.
- Compute inflation: ``I = 1 + k0_p + k_p * O``, ``I_obs = compute_eff_ms(combined) /
  compute_eff_ms(alone)``, fitted per policy by least squares over the combined runs. ``k0_p``
  is the inflation a running loader causes without overloading any core: work it adds to the
  launch path per batch (the pin-memory thread holding the GIL while the launch thread waits
  for it, measured on H200s with trace.sched_events: docs/results-h200x2.md), the same at any
  worker count. ``k_p`` is what overload adds. Both are clipped at 0.
- Hand-off: a loading step also spends ``h_p`` ms outside its compute span beyond the twin's
  (handing the batch over, the H2D copy); the mean over the combined runs the model calls
  compute-bound, clipped at 0. In units of the compute time alone: ``e_p = h_p / T_p``.
- Combined throughput: the fixed point ``X = min(X_L(w, c_L(X)), C_p / (I(D(X)) + e_p))``.
  ``X_L`` falls and ``X * (I(D(X)) + e_p)`` grows with ``X``, so the fixed point is unique; it
  is found by bisection.

Uncertainty: a two-level bootstrap (runs within each configuration, then steps within each run,
as ``compare`` does) refits every parameter; the 2.5/97.5 % percentiles of the refitted
parameters and predictions are the confidence intervals of the model. A *prediction* interval
for one new run widens them by the run-to-run scatter of throughput between repeats
(``run_cv``, pooled over configurations with >= 2 runs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from codl.errors import CodlError
from codl.spec import Mode, Policy

LOADER_MODE = Mode.DATA.value
#: Combined mode -> the mode of its compute twin (``Mode.compute_twin``), as the tables spell them.
COMPUTE_TWIN: dict[str, str] = {
    m.value: twin.value for m in Mode if (twin := m.compute_twin) is not None
}
COMBINED_MODES = tuple(COMPUTE_TWIN)
#: Policies whose launch set is the roles' own CPUs (or ``launch_cores`` of them).
FENCED_POLICIES = frozenset(p.value for p in (Policy.ISOLATED, Policy.SPREAD, Policy.NUMA))
UNFENCED_POLICIES = frozenset(p.value for p in (Policy.NONE, Policy.SHARED))
RUN_COLUMNS = ("run_id", "mode", "policy", "workers", "batch_size")
STEP_COLUMNS = ("run_id", "step_ms")
#: The launch roles' on-CPU time per step (summarize: launch_metrics, helper_metrics): the main
#: thread, then the helpers, whose sum ``isolated-main`` leaves on the loader's cores.
MAIN_CPU_COLUMN = "launch_run_ms"
HELPER_CPU_COLUMNS = ("autograd_run_ms", "pin_memory_run_ms", "comm_run_ms")
# kappa is searched on a log grid, then refined around the best point: the loss is piecewise
# smooth in kappa (a point switches between the two branches of the min), so a grid is robust
# where a local optimiser would stall on a kink.
_KAPPA_RANGE = (0.02, 4.0)
_KAPPA_GRID = 400
_BISECTION_STEPS = 60
#: Core budgets of the data runs from which the per-core rate's exponent is fitted: two budgets
#: place the ceiling M (a per-process plateau against a per-core one); a third is what tells a
#: per-core rate that changes with the cores from a flat one.
MIN_BUDGETS_FOR_EXPONENT = 3
# gamma is searched on a grid, then refined around the best point, as kappa is.
_EXPONENT_RANGE = (-1.0, 1.0)
_EXPONENT_GRID = 21
_K_ITERATIONS = 50


class ModelError(CodlError):
    """The tables cannot support the fit (missing column, mode or worker counts)."""


@dataclass(frozen=True, kw_only=True)
class Params:
    """One set of fitted parameters (the point fit or one bootstrap replicate)."""

    rate: float  # r, samples/s per loader worker
    kappa: float  # worker-equivalents per loader core
    compute: Mapping[str, float]  # policy -> C_p, samples/s per rank
    compute_ms: Mapping[str, float]  # policy -> compute_eff_ms alone
    k: Mapping[str, float]  # policy -> interference coefficient
    # policy -> inflation of a loader that overloads nothing (none fitted: 0)
    k0: Mapping[str, float] = field(default_factory=dict)
    # policy -> ms per step a loading step spends outside its compute span beyond the twin's
    # (batch hand-off, H2D copy), from the compute-bound combined runs (none fitted: 0)
    handoff_ms: Mapping[str, float] = field(default_factory=dict)
    # M, samples/s: a ceiling of the rank's loader that no core adds to (inf: none identified)
    ceiling: float = math.inf
    # gamma: a loader core sustains kappa * (c_L / core_ref) ** gamma worker-equivalents, so
    # the per-core rate falls with fewer cores (gamma > 0) or rises (< 0); fitted only from data
    # runs at >= MIN_BUDGETS_FOR_EXPONENT core budgets, else 0 (flat)
    core_exponent: float = 0.0
    core_ref: float = 1.0  # cores per rank at which the per-core rate is kappa
    # mode -> (tau, tau_helpers): CPU ms per sample of the rank's launch roles (main +
    # helpers) and of the helpers alone; empty when the tables do not have them (each role
    # then counts a whole core)
    occupancy: Mapping[str, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Node:
    """What the roles count needs to know about the runs: same for every fitted run."""

    device: str
    combined_mode: str
    world: int
    batch: int
    pin_memory: bool
    # loader.handoff of the fitted runs: the ring has no pin-memory thread (advise.choose_handoff
    # fits one hand-off at a time).
    handoff: str = "torch"

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    def roles(self, mode: str) -> int:
        """Busy launch roles ``a`` of a rank in ``mode`` (``pinning.roles_for``)."""
        cuda = self.device == "cuda"
        loads = mode in (LOADER_MODE, *COMBINED_MODES)
        computes = mode != LOADER_MODE
        return (
            1
            + int(cuda and computes)
            + int(cuda and loads and self.pin_memory and self.handoff == "torch")
            + int(self.world > 1 and mode != LOADER_MODE)
        )


@dataclass(frozen=True, kw_only=True)
class Fit:
    """The fitted model: point parameters, bootstrap replicates, and what it was fitted on."""

    params: Params
    boot: tuple[Params, ...]
    node: Node
    cores: int  # cores per rank of the combined runs (the default budget of a prediction)
    run_cv: float  # relative run-to-run scatter of throughput between repeats
    loader_item_rate: float  # 1000 / loader_item_ms of the data runs: a worker's item rate
    measured_workers: tuple[int, ...]
    notes: tuple[str, ...] = field(default=())
    budgets: tuple[int, ...] = field(default=())  # the cores per rank the runs had

    @property
    def policies(self) -> tuple[str, ...]:
        """Policies the model can predict: compute capacity and interference both fitted."""
        return tuple(sorted(set(self.params.compute) & set(self.params.k)))

    def parameters(self) -> pd.DataFrame:
        """One row per parameter: point value and 95 % bootstrap interval."""
        rows: list[tuple[str, str, float, npt.NDArray[np.float64]]] = [
            ("rate", "", self.params.rate, np.array([b.rate for b in self.boot])),
            ("kappa", "", self.params.kappa, np.array([b.kappa for b in self.boot])),
        ]
        if math.isfinite(self.params.ceiling):
            # inf: none fitted (one core budget; a note says so).
            draws = np.array([b.ceiling for b in self.boot])
            rows.append(("ceiling", "", self.params.ceiling, draws))
        if self.params.core_exponent != 0.0:
            # 0: not fitted (fewer than MIN_BUDGETS_FOR_EXPONENT budgets; a note says so).
            draws = np.array([b.core_exponent for b in self.boot])
            rows.append(("core_exponent", "", self.params.core_exponent, draws))
        for p in self.policies:
            for name, attr in (
                ("compute", "compute"),
                ("compute_ms", "compute_ms"),
                ("k0", "k0"),
                ("k", "k"),
                ("handoff_ms", "handoff_ms"),
            ):
                point: Mapping[str, float] = getattr(self.params, attr)
                draws = np.array([getattr(b, attr).get(p, np.nan) for b in self.boot])
                rows.append((name, p, point[p], draws))
        out = []
        for name, policy, value, draws in rows:
            # A ceiling is inf in a replicate that places none: an order statistic keeps it.
            known = draws[~np.isnan(draws)]
            if not len(known):
                lo, hi = np.nan, np.nan
            elif np.isfinite(known).all():
                lo, hi = np.percentile(known, [2.5, 97.5])
            else:
                lo, hi = np.percentile(known, [2.5, 97.5], method="nearest")
            out.append({"parameter": name, "policy": policy, "value": value, "lo": lo, "hi": hi})
        return pd.DataFrame(out)


# ---------------------------------------------------------------------------------------------
# Observations: runs + steps -> per-run statistics


def _require(df: pd.DataFrame, columns: Sequence[str], table: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ModelError(f"{table}: missing column(s) {missing}")


def _require_finite(df: pd.DataFrame, columns: Sequence[str], table: str) -> None:
    """ModelError naming the first row of each of ``columns`` that is text, NaN or infinite: a
    table edited by hand or damaged must not reach the fit (NaN spreads through every mean;
    text ended in a traceback)."""
    problems = []
    for col in columns:
        values = pd.to_numeric(df[col], errors="coerce").astype(np.float64)
        bad = ~np.isfinite(values.to_numpy())
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            problems.append(
                f"{table}: column {col!r} row {i + 2} (of the file) is {_cell(df[col].iloc[i])}, "
                f"expected a finite number ({int(bad.sum())} such row(s))"
            )
    if problems:
        raise ModelError("; ".join(problems))


def _cell(value: Any) -> str:
    """A table cell as a message shows it: an empty one (NaN once read) says so."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "empty"
    return repr(value.item() if isinstance(value, np.generic) else value)


def _require_text(df: pd.DataFrame, columns: Sequence[str], table: str) -> None:
    """ModelError naming the first empty cell of each of ``columns``: the run ids, modes and
    policies group the runs, and an empty one (a truncated row, a column blanked by hand)
    would drop its runs from every group without a word."""
    problems = []
    for col in columns:
        empty = df[col].isna().to_numpy() | (df[col].astype(str).str.strip() == "").to_numpy()
        if empty.any():
            i = int(np.flatnonzero(empty)[0])
            problems.append(
                f"{table}: column {col!r} row {i + 2} (of the file) is empty, expected a "
                f"{col.replace('_', ' ')} ({int(empty.sum())} such row(s))"
            )
    if problems:
        raise ModelError("; ".join(problems))


def check_tables(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    runs_name: str = "runs.csv",
    steps_name: str = "steps.csv.gz",
) -> None:
    """ModelError, naming the table (``runs_name``, ``steps_name``: how the message calls it, a
    path where the caller read one) and what was expected, for tables the model cannot read:
    no rows, a missing column, an empty run id, mode or policy, a policy codl does not know,
    a worker count, batch size or step time that is not a finite number."""
    for df, name, what in ((runs, runs_name, "run"), (steps, steps_name, "measured step")):
        if df.empty:
            raise ModelError(
                f"{name}: no rows, expected one per {what} (the workflow's compare step "
                "writes them)"
            )
    _require(runs, RUN_COLUMNS, runs_name)
    _require(steps, STEP_COLUMNS, steps_name)
    _require_text(runs, ("run_id", "mode", "policy"), runs_name)
    _require_text(steps, ("run_id",), steps_name)
    known = sorted(p.value for p in Policy)
    unknown = ~runs["policy"].astype(str).isin(known)
    if unknown.any():
        i = int(np.flatnonzero(unknown.to_numpy())[0])
        raise ModelError(
            f"{runs_name}: column 'policy' row {i + 2} (of the file) is "
            f"{_cell(runs['policy'].iloc[i])}, expected one of {known}"
        )
    _require_finite(runs, ("workers", "batch_size"), runs_name)
    _require_finite(steps, ("step_ms",), steps_name)


@dataclass(frozen=True, kw_only=True)
class RunData:
    """Per-run step arrays, grouped by configuration, that the fit and its bootstrap read."""

    # one row per run: run_id, mode, policy, workers, launch_cores, cores (NaN: unknown), group
    runs: pd.DataFrame
    step_ms: Mapping[str, npt.NDArray[np.float64]]  # every measured step, all ranks
    compute_ms: Mapping[str, npt.NDArray[np.float64]]  # steady-state compute_eff_ms
    node: Node
    item_ms: float
    groups: Mapping[str, tuple[str, ...]]  # configuration -> its run ids
    # Per loading run whose measured window delivered more than its workers produced (it drained
    # batches made before the window), per step aligned with step_ms: the items the workers
    # finished, the worker time they took (ms), and the workers. Its throughput is their
    # production.
    drained: Mapping[str, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], int]] = field(
        default_factory=dict
    )
    first: Mapping[str, Mapping[str, Any]]  # configuration -> one of its runs' rows
    # Per run whose steps table has the launch roles' on-CPU time, per step aligned with step_ms
    # (NaN where a step has no sample): ms of all the roles, and of the helpers alone.
    roles: Mapping[str, Items] = field(default_factory=dict)


Items = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]


def _drained(
    items: Mapping[str, Items],
    step_ms: Mapping[str, npt.NDArray[np.float64]],
    workers: Mapping[str, int],
    batch: int,
) -> dict[str, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], int]]:
    """The loading runs (``workers``: run id -> loader workers) that delivered more than their
    workers produced, with their ``items`` (per step: the items the workers finished and their
    summed worker time, ms) and their workers.

    Busy all the time, ``w`` workers produce ``w`` over the mean worker time per item; less
    when they wait for free prefetch slots. A delivered rate above that came from batches made
    before the window: the prefetch slots the workers filled while the model started, or the
    waves in which workers that start together finish their batches, which a window of a few
    waves cuts at a phase (docs/advisor.md, "Two core budgets"). Such a run is bound by its
    loader, so its workers are busy and their production is its rate; a run below it was not
    (its workers waited for free slots) or paid a per-batch cost outside the items (collation,
    IPC), and keeps its delivered rate."""
    out = {}
    for run_id, w in workers.items():
        if run_id not in items:
            continue
        n, busy = items[run_id]
        if _production(n, busy, w) < batch * 1000.0 / float(step_ms[run_id].mean()):
            out[run_id] = (n, busy, w)
    return out


def _step_arrays(
    s: pd.DataFrame,
) -> tuple[
    dict[str, npt.NDArray[np.float64]],
    dict[str, npt.NDArray[np.float64]],
    dict[str, Items],
    dict[str, Items],
]:
    """Per run: every step's time, the compute time of its steady-state steps, and, aligned
    with the step times, where the table has the loader's columns the items the workers
    finished per timed step and their summed worker time (ms), where it has the launch roles'
    on-CPU time the roles' and the helpers' ms per timed step.

    Compute time is compared on steady-state steps (the outlier rule of steady.py drops the
    deterministic GC-like pauses); throughput keeps every step, as summarize does: a pause
    costs the job wall time.
    """
    outlier = (
        s["outlier"].fillna(False).astype(bool) if "outlier" in s else pd.Series(False, s.index)
    )
    loader = {"loader_items", "loader_item_ms"} <= set(s.columns)
    # Tables summarized before the helpers' columns have the main thread's only: not enough to
    # say what the roles occupy, so such runs have no role time at all.
    cpu = {MAIN_CPU_COLUMN, *HELPER_CPU_COLUMNS} <= set(s.columns)
    step_ms: dict[str, npt.NDArray[np.float64]] = {}
    compute_ms: dict[str, npt.NDArray[np.float64]] = {}
    items: dict[str, Items] = {}
    roles: dict[str, Items] = {}
    for run_id, g in s.groupby("run_id"):
        timed = g[g["step_ms"].notna()]
        step_ms[str(run_id)] = timed["step_ms"].to_numpy(np.float64)
        if loader:
            n = timed["loader_items"].fillna(0).to_numpy(np.float64)
            items[str(run_id)] = (n, n * timed["loader_item_ms"].fillna(0).to_numpy(np.float64))
        if cpu and timed[MAIN_CPU_COLUMN].notna().any():
            helpers = timed[list(HELPER_CPU_COLUMNS)].sum(axis=1, min_count=1)
            main = timed[MAIN_CPU_COLUMN]
            roles[str(run_id)] = (
                (main + helpers).to_numpy(np.float64),
                helpers.to_numpy(np.float64),
            )
        if "compute_eff_ms" in g:
            steady = g.loc[~outlier[g.index], "compute_eff_ms"].dropna()
            compute_ms[str(run_id)] = steady.to_numpy(np.float64)
    return step_ms, compute_ms, items, roles


def _one_loader_setting(combined: pd.DataFrame) -> list[str]:
    """The combined runs' hand-off (none or one; more is refused), after checking they ran at
    one workers' priority: the model has terms for neither."""
    handoffs: list[str] = (
        sorted(map(str, combined["handoff"].dropna().unique())) if "handoff" in combined else []
    )
    if len(handoffs) > 1:
        raise ModelError(
            f"runs.csv: loader.handoff {handoffs} among the combined runs; "
            "fit one hand-off at a time (codl advise --handoff)"
        )
    nices = (
        sorted({int(v) for v in combined["worker_nice"].dropna()})
        if "worker_nice" in combined
        else []
    )
    if len(nices) > 1:
        # Runs at two nice values are two amounts of preemption pooled as repeats of one
        # setting.
        raise ModelError(
            f"runs.csv: loader.worker_nice {nices} among the combined runs; the model fits one "
            "workers' priority at a time (advise on a results directory of one)"
        )
    return handoffs


def run_data(
    runs: pd.DataFrame, steps: pd.DataFrame, *, combined_mode: str | None = None
) -> RunData:
    """Check the tables and keep what the model reads; ``combined_mode`` picks the layout when
    the tables hold both ``data+compute`` and ``combined`` runs.

    CUPTI, ``cuda_api`` and ``sched_events`` runs are left out: their tracers cost the step
    (4-40 % for the CUDA levels, docs/design.md sect. 5), which the model would read as loss of
    capacity.
    """
    check_tables(runs, steps)
    r = runs.copy()
    for col in ("cupti", "cuda_api", "sched_events"):
        if col in r:
            r = r[~r[col].fillna(False).astype(bool)]
    r = r[r["mode"].isin((LOADER_MODE, *COMBINED_MODES, *COMPUTE_TWIN.values()))]
    if combined_mode is not None and combined_mode not in COMBINED_MODES:
        raise ModelError(f"mode {combined_mode!r}: expected one of {list(COMBINED_MODES)}")
    wanted = (combined_mode,) if combined_mode is not None else COMBINED_MODES
    combined = r[r["mode"].isin(wanted)]
    if combined.empty:
        raise ModelError(
            f"runs.csv: no combined runs (mode {' or '.join(wanted)}): the interference term "
            "is fitted from them"
        )
    modes = sorted(combined["mode"].unique())
    if len(modes) > 1:
        raise ModelError(f"runs.csv: both {modes} present; fit one layout at a time (--mode MODE)")
    mode = str(modes[0])
    world = int(combined["world_size"].iloc[0]) if "world_size" in combined else 1
    r = r[r["mode"].isin((LOADER_MODE, mode, COMPUTE_TWIN[mode]))].copy()
    r = _configurations(r)
    pin = combined["pin_memory"].iloc[0] if "pin_memory" in combined else False
    handoffs = _one_loader_setting(combined)
    node = Node(
        device=str(combined["device"].iloc[0]) if "device" in combined else "cpu",
        combined_mode=mode,
        world=world,
        batch=int(combined["batch_size"].iloc[0]),
        pin_memory=bool(pin) if pd.notna(pin) else False,
        handoff=handoffs[0] if handoffs else "torch",
    )
    step_ms, compute_ms, items, roles = _step_arrays(steps[steps["run_id"].isin(r["run_id"])])
    r = r[r["run_id"].astype(str).map(lambda x: len(step_ms.get(x, ())) > 0)]
    item = (
        r.loc[r["mode"] == LOADER_MODE, "loader_item_ms_mean"]
        if "loader_item_ms_mean" in r
        else None
    )
    item_ms = float(item.mean()) if item is not None and len(item.dropna()) else np.nan
    r = r.reset_index(drop=True)
    groups = {str(k): tuple(g["run_id"].astype(str)) for k, g in r.groupby("group", sort=True)}
    first = {
        str(k): {str(c): v for c, v in g.iloc[0].items()} for k, g in r.groupby("group", sort=True)
    }
    loading = r[r["workers"] > 0]
    workers = dict(zip(loading["run_id"].astype(str), loading["workers"].astype(int), strict=True))
    return RunData(
        groups=groups,
        first=first,
        runs=r,
        step_ms=step_ms,
        compute_ms=compute_ms,
        node=node,
        item_ms=item_ms,
        drained=_drained(items, step_ms, workers, node.batch),
        roles=roles,
    )


def _configurations(r: pd.DataFrame) -> pd.DataFrame:
    """``r`` with ``launch_cores`` as text, ``workers`` as int, ``cores`` (the CPUs each run had,
    which summarize reads off the trace; NaN for tables without the column: the fit's
    ``cores``) and ``group``, the configuration the run repeats."""
    r["launch_cores"] = r["launch_cores"].astype(str) if "launch_cores" in r else "auto"
    r["workers"] = r["workers"].fillna(0).astype(int)
    r["cores"] = pd.to_numeric(r["cpus"], errors="coerce") if "cpus" in r else np.nan
    if "pinning_cpus" in r:
        # A trace that does not say which CPUs it had still ran on the budget it asked for.
        asked = pd.to_numeric(r["pinning_cpus"], errors="coerce")
        r["cores"] = r["cores"].where(r["cores"] >= 1, asked)
    r.loc[~(r["cores"] >= 1), "cores"] = np.nan
    r["group"] = (
        r["mode"].astype(str)
        + "|"
        + r["policy"].astype(str)
        + "|"
        + r["workers"].astype(str)
        + "|"
        + r["launch_cores"]
        + "|"
        + r["cores"].map(lambda c: "" if pd.isna(c) else str(int(c)))
    )
    return r


def _f64(values: Any) -> npt.NDArray[np.float64]:
    return np.asarray(values, dtype=np.float64)


def _launch_cores(value: Any) -> int | None:
    """``launch_cores`` of a run or setting: an int, or None for ``auto`` (and for unknown)."""
    try:
        # CSV readers turn an int column with gaps into floats ("1.0").
        return int(float(value))
    except (TypeError, ValueError, OverflowError):
        return None


def _reserved(policy: str, launch_cores: int | None, roles: int) -> int:
    """``n``: the launch CPUs ``policy`` keeps from the loader."""
    if policy in UNFENCED_POLICIES:
        return 0
    if policy == Policy.ISOLATED_MAIN.value:
        return max(1, launch_cores or 1)
    if policy in FENCED_POLICIES:
        return max(roles, launch_cores or roles)
    known = sorted({*UNFENCED_POLICIES, *FENCED_POLICIES, Policy.ISOLATED_MAIN.value})
    raise ModelError(f"policy {policy!r}: unknown, expected one of {known}")


def loader_terms(
    policy: str,
    launch_cores: int | None,
    *,
    cores: int,
    roles: int,
    occupancy: tuple[float, float] | None = None,
) -> tuple[float, float]:
    """``(base, tau)`` of the loader's cores at throughput ``X``: ``c_L(X) = base - tau * X /
    1000``.

    ``occupancy`` is the launch roles' ``(tau, tau_helpers)``, CPU ms per sample (a mode's
    ``Params.occupancy``): unpinned roles take their CPU time from the loader's cores (all of
    them under ``none``/``shared``, the helpers under ``isolated-main``); a fenced launch set is
    the loader's loss whatever the roles use. Without it (``None``) each busy role counts a
    whole core: ``c_L = c - max(a, n)``, ``tau = 0``."""
    n = _reserved(policy, launch_cores, roles)
    if occupancy is None:
        return float(cores - max(roles, n)), 0.0
    tau, tau_helpers = occupancy
    if policy in UNFENCED_POLICIES:
        return float(cores), tau
    if policy == Policy.ISOLATED_MAIN.value:
        return float(cores - n), tau_helpers
    return float(cores - n), 0.0


def group_stats(data: RunData, rng: np.random.Generator | None = None) -> pd.DataFrame:
    """One row per configuration: per-rank throughput and steady compute time, means over runs.

    With ``rng``, one two-level bootstrap replicate: runs drawn with replacement within the
    configuration, then steps with replacement within each drawn run.
    """
    rows = []
    for group, members in data.groups.items():
        ids = np.array(members)
        if rng is not None:
            ids = ids[rng.integers(0, len(ids), len(ids))]
        first = data.first[group]
        thr, comp, drained = [], [], 0
        role: list[float] = []
        helper: list[float] = []
        for rid in ids:
            n = len(data.step_ms[rid])
            c = data.compute_ms.get(rid, np.empty(0))
            pick = rng.integers(0, n, n) if rng is not None else slice(None)
            if rng is not None and len(c):
                c = c[rng.integers(0, len(c), len(c))]
            thr.append(measured_throughput(data, rid, pick))
            drained += rid in data.drained
            if len(c):
                comp.append(float(c.mean()))
            if rid in data.roles:
                # Per sample of the steps drawn: the roles work per batch handed over.
                r_all, r_helpers = (x[pick] for x in data.roles[rid])
                role.append(_per_sample(r_all, data.node.batch))
                helper.append(_per_sample(r_helpers, data.node.batch))
        rows.append(
            {
                "mode": str(first["mode"]),
                "policy": str(first["policy"]),
                "workers": int(first["workers"]),
                "launch_cores": _launch_cores(first["launch_cores"]),
                "cores": float(first["cores"]),
                "runs": len(ids),
                "throughput": float(np.mean(thr)),
                "throughput_sd": float(np.std(thr, ddof=1)) if len(thr) > 1 else np.nan,
                "compute_ms": float(np.mean(comp)) if comp else np.nan,
                "drained": drained,
                "role_ms": _nanmean(role),
                "helper_ms": _nanmean(helper),
            }
        )
    return pd.DataFrame(rows)


def _per_sample(ms: npt.NDArray[np.float64], batch: int) -> float:
    """CPU ms per sample of per-step ``ms`` (NaN steps had no scheduler sample)."""
    known = ms[np.isfinite(ms)]
    return float(known.mean()) / batch if len(known) else np.nan


def _nanmean(values: Sequence[float]) -> float:
    known = [v for v in values if np.isfinite(v)]
    return float(np.mean(known)) if known else np.nan


def measured_throughput(data: RunData, run_id: str, pick: Any = slice(None)) -> float:
    """Per-rank samples/s of a run over its steps ``pick`` (all, or a bootstrap draw): the
    delivered rate, or the workers' production where the window drained batches made before it
    (``RunData.drained``)."""
    if run_id in data.drained:
        n, busy, workers = data.drained[run_id]
        return _production(n[pick], busy[pick], workers)
    return data.node.batch * 1000.0 / float(data.step_ms[run_id][pick].mean())


def _production(n: npt.NDArray[np.float64], busy: npt.NDArray[np.float64], workers: int) -> float:
    """Samples/s ``workers`` busy workers produce: ``w`` over the mean worker time per item."""
    total = float(busy.sum())
    return workers * 1000.0 * float(n.sum()) / total if total > 0 else math.inf


def effective_cores(
    c_l: npt.NDArray[np.float64], exponent: float, ref: float
) -> npt.NDArray[np.float64]:
    """The loader's cores in units of a core at ``ref`` cores: ``c_L * (c_L / ref) ** gamma``
    (``c_L`` itself when ``gamma`` is 0)."""
    c = np.maximum(c_l, 0.0)
    if exponent == 0.0:
        return c
    return np.asarray(c * (c / ref) ** exponent, dtype=np.float64)


def fit_loader(
    workers: npt.ArrayLike,
    cores: npt.ArrayLike,
    throughput: npt.ArrayLike,
    *,
    ceiling: bool = False,
    exponent_ref: float | None = None,
) -> tuple[float, float, float, float]:
    """``(r, kappa, M, gamma)``: least squares in log space (relative errors) of
    ``X = min(r * min(w, kappa * c_L * (c_L / ref) ** gamma), M)``; ``cores`` are the loader's
    cores ``c_L``.

    ``M`` is a ceiling of the rank's loader that no core adds to (the main process collating,
    the pin-memory thread), fitted only with ``ceiling`` (the runs had >= 2 core budgets: at one
    a per-core and a per-process ceiling predict the same runs), else ``inf``. ``gamma`` (a
    per-core rate that changes with the cores) is fitted only with ``exponent_ref`` (the runs
    had >= ``MIN_BUDGETS_FOR_EXPONENT`` budgets; ``ref`` the cores where the rate is kappa),
    else 0. For a given kappa and gamma the points split at a threshold of ``min(w, kappa *
    c_eff)`` into those on the ``r`` branch and those on the ``M`` branch, and for each split
    ``log r`` and ``log M`` are means, so only kappa (and gamma, on a grid) is searched, and
    every split is scored with the full loss. Needs one configuration below the loader's
    saturation and one at it; otherwise the error says which run to add.
    """
    w = np.asarray(workers, dtype=np.float64)
    cl = np.asarray(cores, dtype=np.float64)
    y = np.log(np.asarray(throughput, dtype=np.float64))
    if len(np.unique(w)) < 2:
        raise ModelError(
            f"runs.csv: data-mode runs at {sorted(set(w.astype(int).tolist()))} worker(s) only; "
            "the loader fit needs >= 2 worker counts, one below and one above the loader's cores"
        )
    # Whole-core roles leave whole cores; roles charged their CPU time can leave a fraction.
    if np.any(cl <= 0):
        raise ModelError(
            f"a data run's launch roles took every core (loader cores {_cores_text(cl)}): no "
            "core is left to the loader"
        )
    splits = len(w) if ceiling else 1
    if exponent_ref is None:
        _, rate, kappa, top = _fit_kappa(w, cl, y, splits)
        gamma = 0.0
    else:
        ref = exponent_ref

        def score(g: float) -> float:
            # kappa on its grid only while gamma is searched; refined at the chosen gamma.
            return _fit_kappa(w, effective_cores(cl, g, ref), y, splits, refine=False)[0]

        coarse = np.linspace(*_EXPONENT_RANGE, _EXPONENT_GRID)
        i = int(np.argmin([score(float(g)) for g in coarse]))
        step = coarse[1] - coarse[0]
        fine = np.linspace(coarse[i] - step, coarse[i] + step, 11)
        fine = fine[(fine >= _EXPONENT_RANGE[0]) & (fine <= _EXPONENT_RANGE[1])]
        gamma = float(fine[int(np.argmin([score(float(g)) for g in fine]))])
        cl = effective_cores(cl, gamma, ref)
        _, rate, kappa, top = _fit_kappa(w, cl, y, splits)
    x_w = rate * np.minimum(w, kappa * cl)
    saturated = (w > kappa * cl * (1 + 1e-9)) | (x_w > top * (1 + 1e-9))
    if saturated.all() or not saturated.any():
        where = "above" if saturated.all() else "below"
        need = "fewer" if saturated.all() else "more"
        raise ModelError(
            f"runs.csv: every data-mode run is {where} the loader's saturation point, so the "
            f"per-worker rate and the per-core efficiency cannot be told apart; add a data run "
            f"with {need} workers (loader cores: {_cores_text(np.asarray(cores, np.float64))})"
        )
    return rate, kappa, top, gamma


def _fit_kappa(
    w: npt.NDArray[np.float64],
    cl: npt.NDArray[np.float64],
    y: npt.NDArray[np.float64],
    splits: int,
    *,
    refine: bool = True,
) -> tuple[float, float, float, float]:
    """``(sse, r, kappa, M)`` of the loader's least squares at loader cores ``cl``; without
    ``refine``, kappa's grid point only."""

    def losses(kappas: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], ...]:
        m = np.log(np.minimum(w[None, :], kappas[:, None] * cl[None, :]))
        order = np.argsort(-m, axis=1, kind="stable")
        ms, ys = np.take_along_axis(m, order, axis=1), y[order]
        # Split j: the j points with the largest min(w, kappa c_L) sit on the ceiling.
        best = np.full((len(kappas), 3), np.inf)
        for j in range(splits):
            logr = np.mean(ys[:, j:] - ms[:, j:], axis=1)
            logm = np.mean(ys[:, :j], axis=1) if j else np.full(len(kappas), np.inf)
            pred = np.minimum(logr[:, None] + m, logm[:, None])
            sse = np.sum((y[None, :] - pred) ** 2, axis=1)
            better = sse < best[:, 0] - 1e-12
            best[better] = np.column_stack([sse, logr, logm])[better]
        return best[:, 0], best[:, 1], best[:, 2]

    grid = np.geomspace(*_KAPPA_RANGE, _KAPPA_GRID)
    sse, logr, logm = losses(grid)
    i = int(np.argmin(sse))
    if not refine:
        return float(sse[i]), float(np.exp(logr[i])), float(grid[i]), float(np.exp(logm[i]))
    fine = np.linspace(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)], 801)
    fsse, flogr, flogm = losses(fine)
    j = int(np.argmin(fsse))
    return float(fsse[j]), float(np.exp(flogr[j])), float(fine[j]), float(np.exp(flogm[j]))


def _cores_text(cl: npt.NDArray[np.float64]) -> str:
    """Loader cores for a message: whole, or to a tenth where the roles left a fraction."""
    return "[" + ", ".join(f"{c:g}" for c in sorted(set(np.round(cl, 1).tolist()))) + "]"


def _fit_params(groups: pd.DataFrame, node: Node, cores: int) -> tuple[Params, list[str]]:
    notes: list[str] = []
    groups = groups.assign(cores=run_cores(groups, cores))
    data = groups[groups["mode"] == LOADER_MODE]
    if data.empty:
        raise ModelError("runs.csv: no data-mode runs: the loader capacity is fitted from them")
    occupancy = _occupancy(groups, node)
    if occupancy:
        notes.append(
            "launch roles: "
            + ", ".join(f"{m} {t:.3f} ms CPU per sample" for m, (t, _) in occupancy.items())
            + " (scheduler samples), charged against the loader's cores at the operating point"
        )
    else:
        notes.append(
            "launch roles: no CPU time per step in the tables (launch_run_ms and "
            + ", ".join(HELPER_CPU_COLUMNS)
            + " for data and combined runs): each busy role counts a whole core"
        )
    rate, kappa, ceiling, gamma, ref = _fit_loader_params(data, node, occupancy, notes)
    twin = groups[groups["mode"] == COMPUTE_TWIN[node.combined_mode]]
    if twin.empty:
        raise ModelError(
            f"runs.csv: no {COMPUTE_TWIN[node.combined_mode]}-mode runs: the compute capacity "
            f"of the {node.combined_mode} runs is fitted from them"
        )
    by_policy = twin.groupby("policy")[["throughput", "compute_ms"]].mean()
    compute = {str(p): float(v) for p, v in by_policy["throughput"].items()}
    compute_ms = {str(p): float(v) for p, v in by_policy["compute_ms"].items()}
    comb = groups[groups["mode"] == node.combined_mode]
    missing = sorted(set(comb["policy"]) - set(compute_ms))
    if missing:
        notes.append(f"policies {missing} have combined runs but no compute twin: left out")
    comb = comb[comb["policy"].isin(list(compute_ms)) & comb["compute_ms"].notna()]
    # What a compute twin's step spends outside its compute span (~0): the hand-off's baseline.
    twin_outside = (node.batch * 1000.0 / twin["throughput"] - twin["compute_ms"]).groupby(
        twin["policy"]
    )
    outside = {str(p): float(v) for p, v in twin_outside.mean().items()}
    loader = Params(
        rate=rate,
        kappa=kappa,
        compute=compute,
        compute_ms=compute_ms,
        k={},
        ceiling=ceiling,
        occupancy=occupancy,
        core_exponent=gamma,
        core_ref=ref,
    )
    k0, k, handoff = _fit_interference(comb, node, loader, outside=outside, notes=notes)
    return replace(loader, k=k, k0=k0, handoff_ms=handoff), notes


def _fit_loader_params(
    data: pd.DataFrame,
    node: Node,
    occupancy: Mapping[str, tuple[float, float]],
    notes: list[str],
) -> tuple[float, float, float, float, float]:
    """``(r, kappa, M, gamma, c_ref)`` from the data runs' configurations; notes appended."""
    occ = occupancy.get(LOADER_MODE)
    base, tau = _loader_terms_of(data, node.roles(LOADER_MODE), occ)
    # The data runs' roles occupy their CPU per sample times the throughput the fit reads: a
    # drained window's is its workers' production, the steady rate the roles would serve (the
    # window's burst of prefetched batches is not what the loader's cores sustain).
    cl = base - tau * data["throughput"].to_numpy(np.float64) / 1000.0
    budgets = data["cores"].nunique() > 1
    # The per-core rate is kappa at the largest budget the data runs had.
    ref = float(data["cores"].max())
    exponent = data["cores"].nunique() >= MIN_BUDGETS_FOR_EXPONENT
    rate, kappa, ceiling, gamma = fit_loader(
        data["workers"],
        cl,
        data["throughput"],
        ceiling=budgets,
        exponent_ref=ref if exponent else None,
    )
    if exponent:
        notes.append(
            f"per-core loader rate: kappa x (c_L / {ref:g})^gamma, gamma = {gamma:.2f} fitted "
            f"from data runs at {sorted(data['cores'].astype(int).unique().tolist())} cores "
            "(> 0: a core sustains less with fewer cores)"
        )
    else:
        notes.append(
            f"per-core loader rate: flat (kappa at every budget); data runs at "
            f"{data['cores'].nunique()} core budget(s), >= {MIN_BUDGETS_FOR_EXPONENT} fit one "
            "that changes with the cores"
        )
    cl = effective_cores(cl, gamma, ref)
    on_ceiling = int(np.sum(rate * np.minimum(data["workers"], kappa * cl) > ceiling))
    if not budgets:
        notes.append(
            "ceiling: the data runs had one core budget, so the loader's plateau is read as its "
            "cores'; data runs at a second budget (pinning.cpus) tell a ceiling no core adds to "
            "from it"
        )
    elif on_ceiling == 1:
        notes.append("ceiling: one data configuration sets it (its mean throughput)")
    if np.isfinite(ceiling) and not np.any(
        (data["workers"].to_numpy() > kappa * cl * (1 + 1e-9))
        & (rate * kappa * cl < ceiling * (1 - 1e-9))
    ):
        notes.append(
            "kappa: no data run is bounded by its cores below the loader's ceiling; kappa is the "
            "smallest value the runs allow"
        )
    return rate, kappa, ceiling, gamma, ref


def _occupancy(groups: pd.DataFrame, node: Node) -> dict[str, tuple[float, float]]:
    """Mode -> the launch roles' ``(tau, tau_helpers)``, CPU ms per sample, the mean over the
    mode's configurations; empty unless both the data runs and the combined runs have them (a
    model that charged measured CPU time in one and whole cores in the other would compare the
    loader's fit with the combined runs on different scales)."""
    if "role_ms" not in groups:
        return {}
    out = {}
    for mode in (LOADER_MODE, node.combined_mode):
        g = groups[(groups["mode"] == mode) & np.isfinite(groups["role_ms"])]
        if g.empty:
            return {}
        out[mode] = (float(g["role_ms"].mean()), float(g["helper_ms"].mean()))
    return out


def _loader_terms_of(
    rows: pd.DataFrame, roles: int, occupancy: tuple[float, float] | None
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``(base, tau)`` of each row (``policy``, ``launch_cores``, ``cores``): ``loader_terms``."""
    terms = [
        loader_terms(p, lc, cores=int(c), roles=roles, occupancy=occupancy)
        for p, lc, c in zip(rows["policy"], rows["launch_cores"], rows["cores"], strict=True)
    ]
    if not terms:
        return np.empty(0), np.empty(0)
    base, tau = zip(*terms, strict=True)
    return _f64(base), _f64(tau)


def loader_capacity(
    params: Params,
    w: npt.NDArray[np.float64],
    c_l: npt.NDArray[np.float64],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``(X_W, X_L)``: what the workers can deliver on their cores, ``r * min(w, kappa *
    c_eff)`` (``effective_cores``), and the loader's capacity, that capped at the ceiling
    ``M``."""
    c_eff = effective_cores(c_l, params.core_exponent, params.core_ref)
    x_w = params.rate * np.minimum(w, params.kappa * c_eff)
    return x_w, np.minimum(x_w, params.ceiling)


def _fit_interference(
    comb: pd.DataFrame,
    node: Node,
    params: Params,
    *,
    outside: Mapping[str, float],
    notes: list[str],
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """``(k0_p, k_p, h_p)`` per policy: least squares of ``I_obs - 1 = k0_p + k_p * O``, and
    the hand-off ``h_p``: the mean step time outside the compute span of the runs the model
    calls compute-bound, beyond the twin's (``outside``); clipped at 0.

    The overload ``O`` is taken at the model's own operating point, not at the measured
    throughput: a run the model calls loader-bound has every worker runnable (``D = w``) even
    when its measured throughput falls short of the fitted capacity, and reading ``D`` off the
    measurement would make the fit and the prediction disagree about the same run. The
    operating point depends on the coefficients, so they and ``D`` are iterated to a fixed point.
    ``params`` holds the loader's and the compute's fitted parameters.
    """
    a = node.roles(node.combined_mode)
    policies = sorted(set(comb["policy"].astype(str)))
    w = comb["workers"].to_numpy(np.float64)
    base, tau = _loader_terms_of(comb, a, params.occupancy.get(node.combined_mode))
    cores = comb["cores"].to_numpy(np.float64)
    # Plain arrays: this loop runs for every bootstrap replicate, and pandas' per-call cost
    # dominated the fit.
    pol = comb["policy"].astype(str).to_numpy()
    masks = {p: pol == p for p in policies}
    cap = _f64([params.compute[p] for p in pol])
    alone_ms = _f64([params.compute_ms[p] for p in pol])
    excess = comb["compute_ms"].to_numpy(np.float64) / alone_ms - 1
    step_ms = node.batch * 1000.0 / comb["throughput"].to_numpy(np.float64)
    beyond = step_ms - comb["compute_ms"].to_numpy(np.float64) - _f64([outside[p] for p in pol])
    k0 = dict.fromkeys(policies, 0.0)
    k = dict.fromkeys(policies, 0.0)
    h = dict.fromkeys(policies, 0.0)
    fitted: set[str] = set()
    for _ in range(_K_ITERATIONS):
        op = _solve(
            params,
            _Settings(
                w=w,
                base=base,
                tau=tau,
                cap=cap,
                k0=_f64([k0[p] for p in pol]),
                k=_f64([k[p] for p in pol]),
                cores=cores,
                handoff=_f64([h[p] for p in pol]) / alone_ms,
            ),
        )
        h_old, h = h, _handoff(beyond, masks, op.x < op.x_l * (1 - 1e-9))
        over = np.maximum(0.0, op.demand - op.c_l) / cores
        fitted = {p for p in policies if np.any(over[masks[p]] > 0)}
        new = {p: _line(over[masks[p]], excess[masks[p]]) for p in policies}
        # A policy none of whose runs overloads the cores identifies only k0; its k is the
        # other policies' (the same overload crowds the same cores).
        pooled = float(np.mean([new[p][1] for p in fitted])) if fitted else 0.0
        new = {p: new[p] if p in fitted else (new[p][0], pooled) for p in policies}
        done = all(
            _settled(new[p][0], k0[p]) and _settled(new[p][1], k[p]) and _settled(h[p], h_old[p])
            for p in policies
        )
        k0 = {p: new[p][0] for p in policies}
        k = {p: new[p][1] for p in policies}
        if done:
            break
    for p in policies:
        if p not in fitted:
            # No combined run of this policy overloads the loader's cores: its own k is not
            # identified; borrowing the pooled one keeps its predictions defined.
            notes.append(f"k[{p}]: no combined run overloads the loader's cores; pooled k used")
    return k0, k, h


def _handoff(
    beyond: npt.NDArray[np.float64],
    masks: Mapping[str, npt.NDArray[np.bool_]],
    compute_bound: npt.NDArray[np.bool_],
) -> dict[str, float]:
    """Per policy, the mean step time outside the compute span beyond the twin's of the runs
    that are compute-bound now (a loader-bound run's is its data wait), clipped at 0."""
    return {
        p: max(0.0, float(np.nanmean(beyond[m & compute_bound])))
        if np.any(m & compute_bound)
        else 0.0
        for p, m in masks.items()
    }


def _settled(new: float, old: float) -> bool:
    return abs(new - old) <= 1e-10 * (1 + abs(old))


def _line(over: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> tuple[float, float]:
    """``(k0, k)`` of ``y = k0 + k * over`` by least squares, both >= 0 (inflation below 1 is
    noise, not a speed-up). Without overload (all ``over`` 0) only ``k0`` is identified: k = 0."""
    keep = np.isfinite(y)
    over, y = over[keep], y[keep]
    if not len(y):
        return 0.0, 0.0
    n, sx, sy = len(y), float(over.sum()), float(y.sum())
    sxx, sxy = float((over * over).sum()), float((over * y).sum())
    det = n * sxx - sx * sx
    if det <= 1e-12 * max(1.0, n * sxx):
        return max(0.0, sy / n), 0.0
    k = (n * sxy - sx * sy) / det
    k0 = (sy - k * sx) / n
    if k < 0:
        return max(0.0, sy / n), 0.0
    if k0 < 0:
        return 0.0, max(0.0, sxy / sxx)
    return k0, k


def run_cores(runs: pd.DataFrame, cores: int) -> pd.Series:
    """Cores per rank of each run: its ``cores`` (the CPUs the trace says it had), else
    ``cores``."""
    return runs["cores"].fillna(cores).astype(int)


def _run_cv(groups: pd.DataFrame) -> float:
    multi = groups[(groups["runs"] > 1) & groups["throughput_sd"].notna()]
    if multi.empty:
        return 0.0
    return float(np.sqrt(np.mean((multi["throughput_sd"] / multi["throughput"]) ** 2)))


def fit(data: RunData, *, cores: int, boot: int = 200, seed: int = 0) -> Fit:
    """Fit the model on ``data``; ``cores`` per rank for the runs whose table does not say
    (no ``cpus`` column); ``boot`` replicates."""
    if cores < 1:
        raise ModelError(f"cores: got {cores}, expected >= 1")
    groups = group_stats(data)
    params, notes = _fit_params(groups, data.node, cores)
    drained = groups[groups["drained"] > 0]
    if len(drained):
        which = ", ".join(
            f"{m} {int(w)} workers" + ("" if math.isnan(c) else f" on {int(c)} cores")
            for m, w, c in zip(
                drained["mode"], drained["workers"], drained["cores"].astype(float), strict=True
            )
        )
        notes.append(
            f"runs at {which}: delivered faster than their workers produced (the window "
            "drained batches made before it); their workers' production is used"
        )
    if not set(params.compute) & set(params.k):
        mode = data.node.combined_mode
        combined = sorted(set(data.runs.loc[data.runs["mode"] == mode, "policy"]))
        raise ModelError(
            f"runs.csv: no policy has both {COMPUTE_TWIN[mode]} and {mode} runs (compute: "
            f"{sorted(params.compute)}, combined: {combined})"
        )
    rng = np.random.default_rng(seed)
    reps: list[Params] = []
    failed = 0
    for _ in range(boot):
        try:
            reps.append(_fit_params(group_stats(data, rng), data.node, cores)[0])
        except ModelError:
            # A replicate can land on one side of the saturation point; the interval is then
            # over the replicates that identify the loader, and their count is reported.
            failed += 1
    if failed:
        notes.append(f"{failed} of {boot} bootstrap replicates did not identify the loader")
    data_w = data.runs.loc[data.runs["mode"] == LOADER_MODE, "workers"]
    comb = data.runs[data.runs["mode"] == data.node.combined_mode]
    budgets = sorted({*run_cores(data.runs, cores).astype(int)})
    if len(budgets) > 1:
        notes.append(f"runs at {budgets} cores per rank")
    return Fit(
        params=params,
        boot=tuple(reps),
        node=data.node,
        # Predictions default to the combined runs' budget: the interference was fitted there.
        cores=int(run_cores(comb, cores).mode().max()),
        run_cv=_run_cv(groups),
        loader_item_rate=1000.0 / data.item_ms if np.isfinite(data.item_ms) else np.nan,
        measured_workers=tuple(sorted({*data_w.astype(int), *comb["workers"].astype(int)})),
        budgets=tuple(budgets),
        notes=tuple(notes),
    )


# ---------------------------------------------------------------------------------------------
# Prediction


@dataclass(frozen=True, kw_only=True)
class _Operating:
    """A setting's operating point: throughput, compute inflation, the loader's cores, the
    workers' rate on them and the loader's capacity there, and the runnable demand."""

    x: npt.NDArray[np.float64]
    inflation: npt.NDArray[np.float64]
    c_l: npt.NDArray[np.float64]
    x_w: npt.NDArray[np.float64]
    x_l: npt.NDArray[np.float64]
    demand: npt.NDArray[np.float64]


@dataclass(frozen=True, kw_only=True)
class _Settings:
    """Per-setting arrays of a prediction: workers, the loader's core terms (``c_L(X) = base -
    tau * X / 1000``), compute capacity, interference coefficients, cores and the hand-off in
    units of the compute time alone."""

    w: npt.NDArray[np.float64]
    base: npt.NDArray[np.float64]
    tau: npt.NDArray[np.float64]
    cap: npt.NDArray[np.float64]
    k0: npt.NDArray[np.float64]
    k: npt.NDArray[np.float64]
    cores: npt.NDArray[np.float64]
    handoff: npt.NDArray[np.float64]


def _at(params: Params, s: _Settings, x: npt.NDArray[np.float64]) -> _Operating:
    c_l = s.base - s.tau * x / 1000.0
    x_w, x_l = loader_capacity(params, s.w, c_l)
    # Workers with no core left are all runnable (and deliver nothing).
    demand = np.where(x_w > 0, s.w * x / np.where(x_w > 0, x_w, 1.0), s.w)
    infl = 1.0 + s.k0 + s.k * np.maximum(0.0, demand - c_l) / s.cores
    return _Operating(x=x, inflation=infl, c_l=c_l, x_w=x_w, x_l=x_l, demand=demand)


def _solve(params: Params, s: _Settings) -> _Operating:
    """The fixed point ``X = min(X_L(c_L(X)), C / (I(D(X)) + e))`` of each setting, by
    bisection; ``c_L(X) = base - tau * X / 1000`` (``loader_terms``), ``e`` (``handoff``) is the
    hand-off's time in units of the compute time alone.

    The runnable demand ``D = w * X / X_W`` is the workers' (not the capped ``X_L``): at a
    ceiling that no core adds to, the workers wait for the consumer and ``w * M / X_W`` run.
    ``X_L(c_L(X)) - X`` falls and ``X * (I + e)`` grows with ``X``, so the settings that meet
    both bounds are an interval from 0 and the fixed point is its end."""

    def feasible(x: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
        op = _at(params, s, x)
        return (x <= op.x_l) & (x * (op.inflation + s.handoff) <= s.cap)

    top = _at(params, s, np.zeros_like(s.cap)).x_l
    at_top = feasible(top)
    lo = np.zeros_like(s.cap)
    hi = top.copy()
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        ok = feasible(mid)
        hi = np.where(ok, hi, mid)
        lo = np.where(ok, mid, lo)
    # Roles that take no loader core (tau = 0) leave X_L constant: a loader-bound setting is
    # exactly at it, not a bisection's width below.
    return _at(params, s, np.where(at_top, top, 0.5 * (lo + hi)))


def _evaluate(
    params: Params, node: Node, settings: pd.DataFrame
) -> dict[str, npt.NDArray[np.float64]]:
    a = node.roles(node.combined_mode)
    base, tau = _loader_terms_of(settings, a, params.occupancy.get(node.combined_mode))
    pol = settings["policy"].astype(str)
    cap = _f64(pol.map(params.compute))
    op = _solve(
        params,
        _Settings(
            w=settings["workers"].to_numpy(np.float64),
            base=base,
            tau=tau,
            cap=cap,
            k0=_f64(pol.map(lambda p: params.k0.get(p, 0.0))),
            k=_f64(pol.map(params.k)),
            cores=settings["cores"].to_numpy(np.float64),
            handoff=_f64(pol.map(lambda p: params.handoff_ms.get(p, 0.0)))
            / _f64(pol.map(params.compute_ms)),
        ),
    )
    # A setting with no core for the loader delivers nothing (the harness refuses it anyway).
    none = base < 1
    return {
        "loader_cores": np.where(none, np.nan, op.c_l),
        "loader_capacity": np.where(none, np.nan, op.x_l),
        "compute_capacity": cap,
        "inflation": np.where(none, np.nan, op.inflation),
        "throughput": np.where(none, np.nan, op.x),
    }


def predict(fit: Fit, settings: pd.DataFrame, *, level: float = 0.95) -> pd.DataFrame:
    """Predicted per-rank throughput of each setting (columns ``policy``, ``workers``, and
    optionally ``launch_cores`` (int or None = auto) and ``cores``; defaults: auto, the fitted
    node's cores), with its confidence interval (``throughput_lo``/``_hi``, bootstrap) and the
    prediction interval of one run (``pred_lo``/``_hi``: also the run-to-run scatter)."""
    _require(settings, ("policy", "workers"), "settings")
    s = settings.reset_index(drop=True).copy()
    if "launch_cores" not in s:
        s["launch_cores"] = None
    s["launch_cores"] = s["launch_cores"].map(_launch_cores).astype(object)
    if "cores" not in s:
        s["cores"] = fit.cores
    unknown = sorted(set(s["policy"].astype(str)) - set(fit.policies))
    if unknown:
        raise ModelError(
            f"policy {unknown}: not fitted; the model can predict {list(fit.policies)} (a policy "
            "needs compute runs and combined runs)"
        )
    out = s.assign(**_evaluate(fit.params, fit.node, s))
    out["bound"] = np.where(
        out["throughput"] >= out["loader_capacity"] * (1 - 1e-9), "loader", "compute"
    )
    tail = 100 * (1 - level) / 2
    if fit.boot:
        draws = np.array([_evaluate(b, fit.node, s)["throughput"] for b in fit.boot])
        # Settings that leave the loader no core have no draw at all: NaN, without a warning.
        lo = np.full(len(s), np.nan)
        hi = np.full(len(s), np.nan)
        some = np.isfinite(draws).any(axis=0)
        if some.any():
            lo[some], hi[some] = np.nanpercentile(draws[:, some], [tail, 100 - tail], axis=0)
    else:
        lo = hi = out["throughput"].to_numpy(np.float64)
    # Normal quantile for the two-sided level without scipy: 1.96 at 95 %.
    z = float(np.sqrt(2) * _erfinv(level))
    out["throughput_lo"] = lo
    out["throughput_hi"] = hi
    out["pred_lo"] = lo * max(0.0, 1 - z * fit.run_cv)
    out["pred_hi"] = hi * (1 + z * fit.run_cv)
    out["total_throughput"] = out["throughput"] * fit.node.world
    return out


def predict_draws(fit: Fit, settings: pd.DataFrame) -> npt.NDArray[np.float64]:
    """Each bootstrap replicate's throughput per rank of each setting (as ``predict`` takes
    them), one row per replicate: two settings compared replicate by replicate share the
    fit's errors, which an interval of their ratio then leaves out. No replicates: no rows."""
    # The point prediction without replicates: the settings as ``predict`` completes them.
    s = predict(replace(fit, boot=()), settings)
    if not fit.boot:
        return np.empty((0, len(s)))
    return np.array([_evaluate(b, fit.node, s)["throughput"] for b in fit.boot])


def predict_loader(fit: Fit, settings: pd.DataFrame, *, level: float = 0.95) -> pd.DataFrame:
    """The loader alone (``data`` runs): ``loader_capacity`` of each setting (``policy``,
    ``workers``, ``cores``, optional ``launch_cores``) with its launch roles counted as a data
    run has them, its confidence interval (``_lo``/``_hi``) and one run's (``pred_lo``/``_hi``)."""
    _require(settings, ("policy", "workers", "cores"), "settings")
    s = settings.reset_index(drop=True).copy()
    if "launch_cores" not in s:
        s["launch_cores"] = None
    s["launch_cores"] = s["launch_cores"].map(_launch_cores).astype(object)
    zero = np.zeros(len(s))

    def capacity(p: Params) -> npt.NDArray[np.float64]:
        base, tau = _loader_terms_of(s, fit.node.roles(LOADER_MODE), p.occupancy.get(LOADER_MODE))
        # Alone, the loader runs until its cores or its ceiling hold it: no compute bound.
        alone = _Settings(
            w=s["workers"].to_numpy(np.float64),
            base=base,
            tau=tau,
            cap=np.full(len(s), np.inf),
            k0=zero,
            k=zero,
            cores=s["cores"].to_numpy(np.float64),
            handoff=zero,
        )
        return _solve(p, alone).x

    s["loader_capacity"] = capacity(fit.params)
    tail = 100 * (1 - level) / 2
    draws = np.array([capacity(b) for b in fit.boot]) if fit.boot else s[["loader_capacity"]].T
    lo, hi = np.percentile(np.asarray(draws, dtype=np.float64), [tail, 100 - tail], axis=0)
    z = float(np.sqrt(2) * _erfinv(level))
    s["loader_capacity_lo"], s["loader_capacity_hi"] = lo, hi
    s["pred_lo"], s["pred_hi"] = lo * max(0.0, 1 - z * fit.run_cv), hi * (1 + z * fit.run_cv)
    return s


def _erfinv(y: float) -> float:
    """Inverse error function by Newton's method on math.erf (scipy is not a dependency)."""
    x = 0.0
    for _ in range(50):
        x -= (math.erf(x) - y) / (2 / math.sqrt(math.pi) * math.exp(-x * x))
    return x


def check(fit: Fit, data: RunData) -> pd.DataFrame:
    """Predicted vs measured per-rank throughput of every combined run the model was fitted on:
    ``error`` = predicted / measured - 1; ``inside``: the prediction interval holds the run."""
    runs = data.runs[data.runs["mode"] == data.node.combined_mode]
    runs = runs[runs["policy"].isin(fit.policies)]
    measured = [measured_throughput(data, str(r)) for r in runs["run_id"]]
    settings = runs[["run_id", "policy", "workers", "launch_cores"]].reset_index(drop=True)
    settings["cores"] = run_cores(runs, fit.cores).to_numpy()
    out = predict(fit, settings)
    out["measured"] = measured
    out["error"] = out["throughput"] / out["measured"] - 1
    out["inside"] = (out["measured"] >= out["pred_lo"]) & (out["measured"] <= out["pred_hi"])
    return out


def cross_validate(
    runs: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    cores: int,
    combined_mode: str | None = None,
) -> pd.DataFrame:
    """Out-of-sample error: for each worker count of the combined runs, fit on every run but
    that count's combined ones (isolation runs stay) and predict those. One row per held-out
    run: ``held_workers``, ``run_id``, ``policy``, ``workers``, ``predicted``, ``measured``,
    ``error`` (predicted / measured - 1); a fold that cannot be fitted (e.g. it held out the
    only overloaded runs) has NaN predictions and its reason in ``note``."""
    data = run_data(runs, steps, combined_mode=combined_mode)
    mode = data.node.combined_mode
    comb = data.runs[data.runs["mode"] == mode]
    rows: list[dict[str, Any]] = []
    for held in sorted(comb["workers"].astype(int).unique()):
        out = comb[comb["workers"].astype(int) == held]
        keep = runs[~runs["run_id"].isin(out["run_id"])]
        note = ""
        try:
            fit_ = fit(run_data(keep, steps, combined_mode=mode), cores=cores, boot=0)
            settings = out[["policy", "workers", "launch_cores"]].assign(
                cores=run_cores(out, cores).to_numpy()
            )
            pred = predict(fit_, settings)["throughput"]
        except ModelError as exc:
            pred, note = pd.Series(np.nan, index=range(len(out))), str(exc)
        for (_, r), p in zip(out.iterrows(), pred.to_numpy(), strict=True):
            measured = measured_throughput(data, str(r["run_id"]))
            rows.append(
                {
                    "held_workers": held,
                    "run_id": r["run_id"],
                    "policy": r["policy"],
                    "workers": int(r["workers"]),
                    "predicted": p,
                    "measured": measured,
                    "error": p / measured - 1,
                    "note": note,
                }
            )
    return pd.DataFrame(rows)
