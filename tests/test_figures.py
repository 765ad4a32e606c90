"""Every figure writes a real PNG and PDF from small frames, and says why when it has no data."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import matplotlib.colors
import numpy as np
import pandas as pd
import pytest

from codl.analysis.summarize import sched_deltas
from codl.figures import RUN_FIGURES
from codl.figures import data as figdata
from codl.figures import draw as plots
from codl.figures.registry import FIGURES, FigureInputs
from codl.trace.store import empty_frame

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def outputs(tmp_path: Path, name: str) -> list[Path]:
    return [tmp_path / f"{name}.png", tmp_path / f"{name}.pdf"]


def check(paths: list[Path]) -> None:
    png, pdf = paths
    assert png.stat().st_size > 1000
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert pdf.stat().st_size > 500
    assert pdf.read_bytes()[:5] == b"%PDF-"


def comparison() -> pd.DataFrame:
    """A headline comparison (``compare.headline``): p95 rows with the p50 ratio beside them."""
    rows = []
    for policy, workers, infl in (("none", 4, 2.27), ("isolated", 4, 1.05), ("shared", 8, 1.8)):
        for metric, iso in (
            ("compute_eff_ms", 100.0),
            ("launch_wait_ms", 0.5),
            ("loader_item_ms", 3.0),
            ("data_wait_ms", 50.0),
        ):
            rows.append(
                {
                    "mode": "combined",
                    "policy": policy,
                    "workers": workers,
                    "metric": metric,
                    "stat": "p95",
                    "status": "ok",
                    "isolation": iso,
                    "combined": iso * infl,
                    "ratio": infl,
                    "ci_low": infl * 0.95,
                    "ci_high": infl * 1.05,
                    "diff": iso * (infl - 1),
                    "diff_ci_low": iso * (infl * 0.95 - 1),
                    "diff_ci_high": iso * (infl * 1.05 - 1),
                    "p50_ratio": 1.0 + (infl - 1) / 10,
                }
            )
    return pd.DataFrame(rows)


def steps() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    frames = []
    for mode in ("compute", "combined"):
        for policy in ("none", "isolated"):
            n = 20
            wait = rng.exponential(2.0 if mode == "combined" else 0.1, n)
            frames.append(
                pd.DataFrame(
                    {
                        "mode": mode,
                        "policy": policy,
                        "run_id": [f"{mode}-{policy}-{i % 2}" for i in range(n)],
                        "step": np.arange(n),
                        "launch_wait_ms": wait,
                        "compute_eff_ms": 50 + 3 * wait + rng.normal(0, 1, n),
                        "step_ms": 60 + 3 * wait,
                        # One flagged anomalous step per group, as steady.flag_outliers marks it.
                        "outlier": np.arange(n) == 0,
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)


def decomposition_means() -> pd.DataFrame:
    rows = []
    for policy, host, unexplained in (("none", 3.0, 1.0), ("isolated", 0.5, -0.4)):
        for view, k in (("all steps", 1.0), ("slowest 5 %", 6.0)):
            rows.append(
                {
                    "mode": "combined",
                    "policy": policy,
                    "workers": 2,
                    "world_size": 2,
                    "cupti": False,
                    "cuda_api": False,
                    "view": view,
                    "steps": 20,
                    "host_launch_delay_ms": host * k,
                    "peer_wait_ms": 2.0 * k,
                    "transfer_ms": 0.3,
                    "gpu_slowdown_ms": np.nan,
                    "unattributed_ms": unexplained * k,
                    "compute_inflation_ms": (host + 2.0 + unexplained) * k + 0.3,
                }
            )
    return pd.DataFrame(rows)


def timeline() -> pd.DataFrame:
    rows = [
        ("launch thread", "launch", "span", "data_wait", "data_wait", 0.0, 2.0),
        ("launch thread", "launch", "span", "h2d", "h2d", 2.0, 3.0),
        ("launch thread", "launch", "span", "forward", "forward", 3.0, 8.0),
        ("launch thread", "launch", "span", "backward", "backward", 8.0, 16.0),
        ("launch thread", "launch", "span", "optimizer", "optimizer", 16.0, 18.0),
        ("GPU (events)", "gpu", "span", "forward", "forward", 3.0, 9.0),
        ("loader worker 0", "loader", "span", "fetch", "fetch", 1.0, 4.0),
        ("loader worker 0", "loader", "span", "decode", "decode", 4.0, 12.0),
        ("collectives", "comm", "span", "b0", "", 10.0, 14.0),
        # A wait is a per-step total (schedstat has no position): a duration from 0.
        ("loader w (5000)", "loader", "wait", "2.00 ms", "", 0.0, 2.0),
    ]
    return pd.DataFrame(rows, columns=figdata.TIMELINE_COLUMNS)


def api() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "label": ["isolation / none"] * 50 + ["combined / none"] * 50,
            "name": "cudaLaunchKernel",
            "us": np.concatenate([rng.lognormal(1.5, 0.3, 50), rng.lognormal(2.5, 0.5, 50)]),
        }
    )


def heatmap() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "policy": ["none", "none", "isolated", "isolated"],
            "workers": [4, 8, 4, 8],
            "throughput_samples_s": [900.0, 950.0, 1200.0, 1210.0],
            "ratio": [2.2, 2.5, 1.05, np.nan],
        }
    )


CASES: dict[str, tuple[Callable[[Path], None], Callable[[Path], None]]] = {
    # name: (draw with data, draw with nothing)
    "component_durations": (
        lambda p: plots.component_durations(comparison(), outputs(p, "x")),
        lambda p: plots.component_durations(pd.DataFrame(), outputs(p, "x")),
    ),
    "api_latency_cdf": (
        lambda p: plots.api_latency_cdf(api(), outputs(p, "x")),
        lambda p: plots.api_latency_cdf(pd.DataFrame(), outputs(p, "x")),
    ),
    "launch_wait_vs_compute": (
        lambda p: plots.launch_wait_vs_compute(steps(), outputs(p, "x")),
        lambda p: plots.launch_wait_vs_compute(pd.DataFrame(), outputs(p, "x")),
    ),
    "step_timeline": (
        lambda p: plots.step_timeline(timeline(), outputs(p, "x"), title="one step"),
        lambda p: plots.step_timeline(pd.DataFrame(), outputs(p, "x")),
    ),
    "policy_heatmap": (
        lambda p: plots.policy_heatmap(heatmap(), outputs(p, "x")),
        lambda p: plots.policy_heatmap(pd.DataFrame(), outputs(p, "x")),
    ),
    "step_time_distributions": (
        lambda p: plots.step_time_distributions(steps(), outputs(p, "x")),
        lambda p: plots.step_time_distributions(pd.DataFrame(), outputs(p, "x")),
    ),
    "decomposition": (
        lambda p: plots.decomposition(decomposition_means(), outputs(p, "x")),
        lambda p: plots.decomposition(pd.DataFrame(), outputs(p, "x")),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_figure_with_data(name: str, tmp_path: Path) -> None:
    CASES[name][0](tmp_path)
    check(outputs(tmp_path, "x"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_figure_without_data(name: str, tmp_path: Path) -> None:
    CASES[name][1](tmp_path)
    check(outputs(tmp_path, "x"))


def test_empty_figures_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    notes: list[str] = []
    real = plots._note
    monkeypatch.setattr(plots, "_note", lambda ax, text: (notes.append(text), real(ax, text)))
    for _, empty in CASES.values():
        empty(tmp_path)
    # One explanation per empty figure (the heatmap has two panels).
    assert len(notes) == len(CASES) + 1
    assert all(n.strip() for n in notes)
    assert any("trace.cuda_api or trace.cupti" in n for n in notes)


def test_component_durations_names_missing_twin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notes: list[str] = []
    monkeypatch.setattr(plots, "_note", lambda ax, text: notes.append(text))
    missing = comparison().assign(status="missing isolation run: mode=compute with ...")
    plots.component_durations(missing, outputs(tmp_path, "x"))
    assert "mode=compute" in notes[0]


def test_component_durations_defaults_to_loader_item_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figs: list[Any] = []
    real = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, outs: (figs.append(fig), real(fig, outs)))
    plots.component_durations(comparison(), outputs(tmp_path, "x"))
    ylabels = [ax.get_ylabel() for ax in figs[0].axes]
    # Data wait is not comparable between isolation and combined: per-item time replaces it.
    assert "p95 of " + plots.METRIC_LABELS["loader_item_ms"] in ylabels
    assert not any(plots.METRIC_LABELS["data_wait_ms"] in y for y in ylabels)
    check(outputs(tmp_path, "x"))


def test_step_timeline_legend_names_phases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figs: list[Any] = []
    real = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, outs: (figs.append(fig), real(fig, outs)))
    plots.step_timeline(timeline(), outputs(tmp_path, "x"))
    legend = figs[0].axes[0].get_legend()
    names = [t.get_text() for t in legend.get_texts()]
    assert names[:5] == ["data_wait", "h2d", "forward", "backward", "optimizer"]
    assert "loader" in names
    colours = {plots.PHASE_COLORS[p] for p in ("data_wait", "h2d", "forward", "backward")}
    assert len(colours) == 4


def test_step_timeline_from_trace_tables(tmp_path: Path) -> None:
    """figures.data.timeline_bars -> figures.draw.step_timeline, phases carried for colouring."""
    base = 5_000_000_000_000
    ms = 1_000_000
    app = pd.DataFrame(
        {
            "rank": np.array([0] * 4, dtype="i2"),
            "step": np.array([3] * 4, dtype="i4"),
            "phase": pd.Categorical(["step", "data_wait", "forward", "backward"]),
            "tid": 1,
            "start_ns": np.array([0, 0, 2, 6]) * ms + base,
            "end_ns": np.array([10, 2, 6, 10]) * ms + base,
            "gpu_ns": np.array([-1, -1, 3 * ms, -1]),
        }
    )
    tables = {
        "events/app": app,
        "events/loader": empty_frame("events/loader"),
        "events/comm": empty_frame("events/comm"),
        "samples/sched": empty_frame("samples/sched"),
        "threads": empty_frame("threads"),
    }
    tl = figdata.timeline_bars(tables, step=3)
    launch = tl[tl["track"] == "launch thread"]
    assert list(launch["phase"]) == ["data_wait", "forward", "backward"]
    gpu = tl[tl["track"] == "GPU (events)"].iloc[0]
    assert (gpu["start_ms"], gpu["end_ms"]) == (2.0, 5.0)
    plots.step_timeline(tl, outputs(tmp_path, "x"), title="t")
    check(outputs(tmp_path, "x"))
    assert figdata.timeline_bars(tables, step=99).empty


def test_the_timeline_reads_one_steps_scheduler_deltas_as_the_whole_tables() -> None:
    # The step timeline's waits come from one rank's deltas of the shown step only
    # (sched_deltas' ``step``); they are those of the whole table, through the cases it handles:
    # two ranks with one TID, threads sampled in other orders, two samples in one step, a step
    # tagged out of time order, a TID reused (its counters restart).
    rng = np.random.default_rng(7)
    rows = []
    for rank in (0, 1):
        for tid in (10, 11, 12):
            run = wait = 0
            steps = list(range(-1, 12))
            if tid == 11:
                steps.insert(5, 4)  # two samples tagged 4
                steps[8], steps[9] = steps[9], steps[8]  # tags out of time order
            for i, step in enumerate(steps):
                if tid == 12 and i == 7:
                    run = wait = 0  # the TID reused by a new thread
                run += int(rng.integers(1, 9)) * 1000
                wait += int(rng.integers(0, 5)) * 1000
                rows.append(
                    {
                        "t_ns": 10**9 + i * 10**6 + tid,
                        "rank": rank,
                        "pid": 1,
                        "tid": tid,
                        "step": step,
                        "run_ns": run,
                        "wait_ns": wait,
                        "timeslices": i,
                        "voluntary": i,
                        "involuntary": 0,
                        "cpu": tid % 4,
                    }
                )
    order = rng.permutation(len(rows))
    sched = pd.DataFrame([rows[i] for i in order]).astype({"rank": "i2", "step": "i4", "cpu": "i2"})
    whole = sched_deltas(sched)
    for rank in (0, 1):
        for step in range(-1, 12):
            want = whole[(whole["rank"] == rank) & (whole["step"] == step)]
            got = sched_deltas(sched[sched["rank"] == rank], step=step)
            assert len(want) > 0 or step == -1
            pd.testing.assert_frame_equal(
                got.reset_index(drop=True), want.reset_index(drop=True), check_exact=True
            )


def _drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    figs: list[Any] = []
    real = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, outs: (figs.append(fig), real(fig, outs)))
    return figs


def test_component_durations_leads_with_p95_and_shows_p50(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figs = _drawn(monkeypatch)
    plots.component_durations(comparison(), outputs(tmp_path, "x"))
    texts = [t.get_text() for ax in figs[0].axes for t in ax.texts]
    # none: p95 ratio 2.27 (+127 %), p50 ratio 1.127 (+13 %).
    assert "+127%\n(p50 +13%)" in texts
    assert figs[0].axes[0].get_ylabel().startswith("p95 of ")


def test_component_durations_labels_a_zero_twin_by_its_difference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figs = _drawn(monkeypatch)
    zero = (
        comparison()
        .iloc[:1]
        .assign(
            isolation=0.0, combined=0.4, ratio=np.nan, diff=0.4, diff_ci_low=0.1, diff_ci_high=0.7
        )
    )
    plots.component_durations(zero, outputs(tmp_path, "x"))
    texts = [t.get_text() for ax in figs[0].axes for t in ax.texts]
    assert texts[0].startswith("+0.4")


def test_flagged_steps_are_drawn_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figs = _drawn(monkeypatch)
    plots.step_time_distributions(steps(), outputs(tmp_path, "x"))
    labels = [t.get_text() for t in figs[0].axes[0].get_xticklabels()]
    assert all("1 flagged" in label for label in labels)
    plots.launch_wait_vs_compute(steps(), outputs(tmp_path, "y"))
    legend = [t.get_text() for t in figs[1].axes[0].get_legend().get_texts()]
    assert "flagged anomalous step (n=4)" in legend


def test_decomposition_draws_each_part_with_its_interval_and_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figs = _drawn(monkeypatch)
    from codl.analysis import decompose as dec

    # Two runs per group, one block each: run a's parts are the means', run b's twice them.
    cols = [c for c in dec.MEAN_COLUMNS if c in decomposition_means()]
    rows = []
    for rid, k in (("a", 1.0), ("b", 3.0)):
        for _, m in decomposition_means().iterrows():
            rows.append(
                m.to_dict() | {"row": figdata.RUN_ROW, "run_id": rid} | {c: m[c] * k for c in cols}
            )
    runs = pd.DataFrame(rows)
    means = runs.groupby(["policy", "view"], sort=False)[cols].mean()
    groups = decomposition_means().set_index(["policy", "view"])
    groups[cols] = means
    groups = groups.reset_index().assign(row=figdata.GROUP_ROW, n_runs=2, n_blocks=2, note="")
    for c in cols:
        groups[f"{c}_ci_low"], groups[f"{c}_ci_high"] = groups[c] - 1.0, groups[c] + 1.0
    # The isolated tail rests on too few steps: no value, and the figure says so.
    few = (groups["policy"] == "isolated") & (groups["view"] == "slowest 5 %")
    groups.loc[few, cols] = np.nan
    groups.loc[few, "note"] = "too few steps (3 < 20)"
    plots.decomposition(pd.concat([groups, runs], ignore_index=True), outputs(tmp_path, "x"))
    ax = figs[0].axes[0]
    bars = [p for p in ax.patches if p.get_height() != 0]
    # Per group, the parts (all bars but the black inflation bar) add up to the inflation.
    for i in range(len(groups)):
        mine = [p for p in bars if abs(p.get_x() + p.get_width() / 2 - i) < 0.45]
        if few[i]:
            assert not mine
            continue
        black = [p for p in mine if matplotlib.colors.to_hex(p.get_facecolor()) == "#222222"]
        assert len(black) == 1, i
        parts = sum(p.get_height() for p in mine if p not in black)
        assert parts == pytest.approx(black[0].get_height()), i
    # The isolated groups' unattributed part is negative: drawn below zero.
    assert min(p.get_height() for p in bars) < 0
    # One dot per run beside every drawn bar; the whiskers are the intervals' (+/- 1 ms).
    dots = [c for c in ax.collections if len(c.get_offsets()) == 2 and c.get_sizes().size]
    assert len(dots) == 5 * 3  # 3 drawn groups x 5 measured columns, 2 runs each
    texts = [t.get_text() for t in ax.texts]
    assert any(t.startswith("too few steps") for t in texts)
    assert "mean over blocks" in ax.get_title() and "Student-t" in ax.get_title()


def _rgb(color: str) -> tuple[float, ...]:
    import matplotlib.colors

    return tuple(matplotlib.colors.to_rgb(color))


def test_component_durations_has_ci_on_both_bars_and_labels_clear_of_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figs = _drawn(monkeypatch)
    head = comparison().assign(
        isolation_ci_low=lambda d: d["isolation"] * 0.9,
        isolation_ci_high=lambda d: d["isolation"] * 1.1,
        combined_ci_low=lambda d: d["combined"] * 0.8,
        combined_ci_high=lambda d: d["combined"] * 1.3,
        n_runs=3,
        n_isolation_runs=2,
        steps=600,
        isolation_steps=400,
    )
    plots.component_durations(head, outputs(tmp_path, "x"))
    ax = figs[0].axes[0]
    bars = [c for c in ax.containers if hasattr(c, "errorbar")]
    assert len(bars) == 2 and all(c.errorbar is not None for c in bars)
    d = head[head["metric"] == "compute_eff_ms"]
    # Each change label is anchored at the top of its pair's highest whisker, never on a bar.
    tops = sorted(t.xy[1] for t in ax.texts)
    assert tops == sorted(d["combined_ci_high"])
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert all("runs 2+3" in t and "steps 400+600" in t for t in ticks)


def test_launch_wait_vs_compute_title_claims_no_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figs = _drawn(monkeypatch)
    plots.launch_wait_vs_compute(steps(), outputs(tmp_path, "x"))
    ax = figs[0].axes[0]
    assert "->" not in ax.get_title() and "Mechanism" not in ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "combined / none (2 runs, 20 steps)" in legend


def test_policy_heatmap_centres_ratio_at_one_with_ci_and_readable_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figs = _drawn(monkeypatch)
    table = heatmap().assign(
        ci_low=lambda d: d["ratio"] * 0.9,
        ci_high=lambda d: d["ratio"] * 1.1,
        n_runs=3,
        n_isolation_runs=3,
        runs=3,
    )
    plots.policy_heatmap(table, outputs(tmp_path, "x"))
    thr, ratio = figs[0].axes[0], figs[0].axes[1]
    im = ratio.get_images()[0]
    assert im.norm(1.0) == pytest.approx(0.5)
    assert im.cmap.name.startswith("RdBu")
    texts = {t.get_text(): t.get_color() for t in ratio.texts}
    assert "1.05\n[0.95, 1.16]\n(3/3 runs)" in texts
    # Near 1 the cell is near white: its text must be dark.
    assert texts["1.05\n[0.95, 1.16]\n(3/3 runs)"] == "k"
    assert "no pair" in texts
    # One y label for the shared policy axis: none on the right panel to collide.
    assert thr.get_ylabel() and not ratio.get_ylabel()


def test_step_timeline_draws_waits_as_totals_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figs = _drawn(monkeypatch)
    plots.step_timeline(timeline(), outputs(tmp_path, "x"), title="Run abc")
    spans, waits = figs[0].axes[:2]
    assert "loader w (5000)" not in [t.get_text() for t in spans.get_yticklabels()]
    assert [t.get_text() for t in waits.get_yticklabels()] == ["loader w (5000)"]
    assert "total" in waits.get_xlabel()
    # Loader spans carry their stage name, not its first letter.
    assert "decode" in [t.get_text() for t in spans.texts]
    assert not {"f", "d", "t"} & {t.get_text() for t in spans.texts}


def test_step_time_distributions_in_study_order_with_n(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figs = _drawn(monkeypatch)
    plots.step_time_distributions(steps(), outputs(tmp_path, "x"))
    labels = [t.get_text() for t in figs[0].axes[0].get_xticklabels()]
    # Mode order of spec.Mode (compute before combined), then policy order (none first).
    assert [lab.split("\n")[:2] for lab in labels] == [
        ["compute", "none"],
        ["compute", "isolated"],
        ["combined", "none"],
        ["combined", "isolated"],
    ]
    assert all("2 runs\n19 steps" in lab for lab in labels)


def test_arm_intervals_bracket_each_arm() -> None:
    st = steps()
    head = pd.DataFrame(
        [
            {
                "metric": "compute_eff_ms",
                "stat": "p95",
                "status": "ok",
                "runs": "combined-none-0 combined-none-1",
                "isolation_runs": "compute-none-0 compute-none-1",
            },
            {"metric": "compute_eff_ms", "stat": "p95", "status": "missing", "runs": "x"},
        ]
    )
    out = figdata.with_arm_intervals(head, st)
    ok = out.iloc[0]
    for arm, mode in (("isolation", "compute"), ("combined", "combined")):
        g = st[(st["mode"] == mode) & (st["policy"] == "none") & ~st["outlier"]]
        point = g.groupby("run_id")["compute_eff_ms"].quantile(0.95).mean()
        assert ok[f"{arm}_ci_low"] <= point <= ok[f"{arm}_ci_high"]
        assert ok[f"{arm}_ci_low"] < ok[f"{arm}_ci_high"]
    assert np.isnan(out.iloc[1]["combined_ci_low"])


def test_timeline_run_is_the_typical_plain_combined_run() -> None:
    summary = pd.DataFrame(
        {
            "run_id": ["a", "b", "c", "d", "e"],
            "mode": ["combined", "combined", "combined", "combined", "compute"],
            "step_ms_p50": [10.0, 20.0, 31.0, 21.0, 20.0],
            "cuda_api": [False, False, False, True, False],
        }
    )
    # Plain combined runs a, b, c: median 20 -> b (d is traced, e is not combined).
    assert figdata.timeline_run(summary) == "b"
    assert figdata.timeline_run(summary[summary["mode"] == "compute"]) == ""


def test_timeline_run_prefers_the_kernels_scheduler_record_with_pinned_memory() -> None:
    summary = pd.DataFrame(
        {
            "run_id": ["a", "b", "c", "d", "e", "f"],
            "mode": ["combined"] * 6,
            "step_ms_p50": [10.0, 20.0, 66.0, 70.0, 84.0, 68.0],
            "cuda_api": [False, False, False, False, False, True],
            "sched_events": [False, False, True, True, True, True],
            "pin_memory": [True, True, True, True, False, True],
        }
    )
    # Recorded, untraced, pinned: c and d (median 68) -> c; e lacks pinning, f has callbacks.
    assert figdata.timeline_run(summary) == "c"
    # Without pinned runs among the recorded ones, the recorded run still wins over plain ones.
    assert figdata.timeline_run(summary[summary["run_id"].isin(["a", "b", "e"])]) == "e"


def test_heatmap_table_keeps_one_plain_comparison_per_cell() -> None:
    summary = pd.DataFrame(
        {
            "mode": ["combined", "combined", "compute"],
            "policy": ["none"] * 3,
            "workers": [4, 4, 0],
            "cuda_api": [False, True, False],
            "throughput_samples_s": [100.0, 50.0, 200.0],
        }
    )
    comp = pd.DataFrame(
        {
            "mode": ["combined", "combined"],
            "policy": ["none", "none"],
            "workers": [4, 4],
            "cuda_api": [False, True],
            "metric": "compute_eff_ms",
            "stat": "p95",
            "status": "ok",
            "ratio": [1.5, 3.0],
            "ci_low": [1.4, 2.0],
            "ci_high": [1.6, 4.0],
            "n_runs": [3, 1],
            "n_isolation_runs": [3, 1],
        }
    )
    t = figdata.heatmap_table(summary, comp)
    assert len(t) == 1
    row = t.iloc[0]
    # The traced run is slower by itself: left out of both throughput and ratio.
    assert (row["throughput_samples_s"], row["runs"], row["ratio"]) == (100.0, 1, 1.5)
    assert (row["ci_low"], row["ci_high"]) == (1.4, 1.6)


def test_decomposition_runs_counts_runs_per_group() -> None:
    means = decomposition_means()
    rows = means.drop(columns=["view", "steps"]).drop_duplicates()
    decomp = pd.concat([rows.assign(run_id=r) for r in ("r1", "r2")], ignore_index=True)
    out = figdata.decomposition_runs(means, decomp)
    assert list(out["runs"]) == [2] * len(means)


def test_per_step_figures_keep_traced_and_unpinned_runs_apart() -> None:
    steps = pd.DataFrame(
        {
            "run_id": ["a", "a", "b", "c", "d"],
            "mode": ["combined"] * 5,
            "cuda_api": [False, False, True, False, False],
            "sched_events": [False, False, True, True, True],
            "pin_memory": [True, True, True, False, True],
        }
    )
    marks = plots._with_marks(steps)["_marks"].tolist()
    assert marks == ["", "", "+API +ftrace", "+ftrace no pin", "+ftrace"]


GOLDEN_TABLES = Path(__file__).resolve().parent / "golden" / "tables"
# What makes runs unlike: rank count and tracing level (and the loader's pinned memory).
UNLIKE = ["nodes", "ranks_per_node", "cupti", "cuda_api", "sched_events", "pin_memory"]


def test_no_figure_groups_runs_of_other_ranks_or_tracing_under_one_label() -> None:
    # The golden tables (real CPU runs) hold a 1-rank and a 2-rank `combined` run under `none`;
    # a CUDA-API-traced copy of the 1-rank one adds the case of results/h200's `none` row.
    runs = pd.read_csv(GOLDEN_TABLES / "runs.csv", dtype={"run_id": str})
    steps = pd.read_csv(GOLDEN_TABLES / "steps.csv", dtype={"run_id": str})
    comparison = pd.read_csv(GOLDEN_TABLES / "comparison.csv")
    combined = runs[(runs["mode"] == "combined") & (runs["policy"] == "none")]
    assert set(combined["ranks_per_node"]) == {1, 2}
    one = str(combined.loc[combined["ranks_per_node"] == 1, "run_id"].iloc[0])
    runs = pd.concat([runs, runs[runs["run_id"] == one].assign(run_id="traced", cuda_api=True)])
    steps = pd.concat([steps, steps[steps["run_id"] == one].assign(run_id="traced", cuda_api=True)])

    def alike(group: pd.DataFrame) -> bool:
        cols = [c for c in UNLIKE if c in group]
        return len(group[cols].astype(str).replace({"nan": ""}).drop_duplicates()) == 1

    # launch_wait_vs_compute and step_time_distributions: a legend entry or box per group.
    per_step = plots._with_marks(figdata.with_run_flags(steps, runs))
    groups = per_step.groupby(["mode", "policy", "_marks"])
    assert all(alike(g) for _, g in groups)
    assert groups.ngroups > per_step.groupby(["mode", "policy"]).ngroups
    # component_durations: a tick label per comparison row, unlike rows never share one.
    for _, rows in comparison[comparison["status"] == "ok"].groupby(["metric", "stat"]):
        labelled = plots._labelled_pairs(rows.copy())
        assert all(alike(g) for _, g in labelled.groupby("label"))
    # policy_heatmap: the 2-rank run has a row of its own, the traced run is in no cell.
    table = figdata.heatmap_table(runs, comparison)
    none = table[table["policy"] == "none"]
    two = none["row"].str.contains("x2 ranks", regex=False)
    assert two.any() and (~two).any()
    multi = runs[~runs["mode"].isin(list(figdata.COMPONENT_MODES))]
    plain_one_rank = multi[
        (multi["policy"] == "none") & (multi["ranks_per_node"] == 1) & (multi["run_id"] != "traced")
    ]
    assert none.loc[~two, "runs"].sum() == len(plain_one_rank)
    two_ranks = multi[(multi["policy"] == "none") & (multi["ranks_per_node"] == 2)]
    assert none.loc[two, "runs"].sum() == len(two_ranks) > 0


def test_busy_cpu_runs_are_marked_in_every_figure_that_draws_runs(tmp_path: Path) -> None:
    runs = pd.read_csv(GOLDEN_TABLES / "runs.csv", dtype={"run_id": str})
    steps = pd.read_csv(GOLDEN_TABLES / "steps.csv", dtype={"run_id": str})
    comparison = pd.read_csv(GOLDEN_TABLES / "comparison.csv")
    decomposition = pd.read_csv(GOLDEN_TABLES / "decomposition.csv", dtype={"run_id": str})
    from codl.analysis import decompose as dec
    from codl.analysis.load import FLAG_COLUMN, LOAD_MARK

    # Recorded on a shared 2-core VM: every golden run is flagged, so every group is marked.
    assert runs[FLAG_COLUMN].all()
    marks = plots._with_marks(figdata.with_run_flags(steps, runs))["_marks"]
    assert marks.str.contains(LOAD_MARK, regex=False).all()
    assert all(LOAD_MARK in plots._run_marks(r) for _, r in comparison.iterrows())
    bars = figdata.decomposition_runs(dec.decomposition_means(decomposition), decomposition, runs)
    assert all(LOAD_MARK in label for label in plots._decomposition_labels(bars))
    table = figdata.heatmap_table(runs, comparison)
    assert (table["busy_runs"].fillna(0) > 0).any()
    # A quiet set (the flag cleared) carries no mark.
    quiet = runs.assign(**{FLAG_COLUMN: False})
    marks = plots._with_marks(figdata.with_run_flags(steps, quiet))["_marks"]
    assert not marks.str.contains(LOAD_MARK, regex=False).any()
    # And the figures draw with the marks in place.
    plots.policy_heatmap(table, outputs(tmp_path, "heat"))
    check(outputs(tmp_path, "heat"))


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """The figures the draw functions make, kept open instead of saved (closed after)."""
    import matplotlib.pyplot as plt

    figs: list[Any] = []
    monkeypatch.setattr(plots, "_save", lambda fig, _outputs: figs.append(fig))
    yield figs
    for fig in figs:
        plt.close(fig)


def test_a_near_zero_twin_gets_a_difference_not_a_percentage() -> None:
    # A run-queue wait of 2 us against 11 us: +449 % said nothing readable.
    assert plots._effect_label(5.49, 0.009, 2.0, base=0.002, scale=100.0) == "+0.009 ms"
    assert plots._effect_label(1.44, 44.0, 1.2, base=100.0, scale=150.0) == "+44%\n(p50 +20%)"


def test_placeholders_stay_inside_their_frame() -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2.6, 2.6))
    reason = "no comparison has both arms: " + "the twin runs are missing for this policy " * 4
    plots._note(ax, reason)
    fig.canvas.draw()
    box, frame = ax.texts[0].get_window_extent(), ax.get_window_extent()
    plt.close(fig)
    assert frame.x0 < box.x0 and box.x1 < frame.x1 and frame.y0 < box.y0 and box.y1 < frame.y1


def test_the_interference_map_colour_bar_speaks_the_cells_unit(drawn: list[Any]) -> None:
    from codl.advisor import interference_map as imap
    from test_interference_map import planted

    runs, steps = planted()
    plots.interference_map(imap.build_map(runs, steps, boot=20), [])
    (fig,) = drawn
    fig.canvas.draw()
    cells = {t.get_text() for ax in fig.axes for t in ax.texts}
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    labels = [[t.get_text() for t in ax.get_yticklabels() if t.get_text()] for ax in bars]
    # Lost throughput: cells in percent and so its bars; inflation: ratios both.
    assert any(c.endswith("%") for c in cells)
    percent = [ls for ls in labels if ls and all(x.endswith("%") for x in ls)]
    ratios = [ls for ls in labels if ls and not any(x.endswith("%") for x in ls)]
    assert percent and ratios and len(percent) + len(ratios) == len(bars)


def test_predicted_vs_measured_labels_do_not_overlap(drawn: list[Any]) -> None:
    # Twelve settings within a few percent of each other (verify-headroom's crowding).
    n = 12
    measured = 1000.0 + 4.0 * np.arange(n)
    table = pd.DataFrame(
        {
            "policy": ["none", "isolated-main"] * (n // 2),
            "workers": np.arange(n) + 8,
            "measured": measured,
            "throughput": measured * (1 + 0.01 * np.sin(np.arange(n))),
            "pred_lo": measured * 0.97,
            "pred_hi": measured * 1.03,
            "advised": [True] + [False] * (n - 1),
            "n_runs": 3,
        }
    )
    summary = {
        "settings": n,
        "median_abs_error": 0.01,
        "worst_abs_error": 0.02,
        "advised_vs_best": 0.0,
        "advised_vs_other": np.nan,
    }
    plots.predicted_vs_measured(table, [], summary=summary)
    (fig,) = drawn
    fig.canvas.draw()
    ax = fig.axes[0]
    from matplotlib.text import Text

    # The text's own box (an Annotation's includes its leader line).
    boxes = [Text.get_window_extent(t) for t in ax.texts if t.get_text().endswith("w")]
    assert len(boxes) == n
    overlaps = [(i, j) for i in range(n) for j in range(i + 1, n) if boxes[i].overlaps(boxes[j])]
    assert not overlaps, overlaps


# Figures claim only what they show: no interval over one run, no text under 8 pt, none cut
# or printed over another (the demo's figures: one run per setting, a few steps each).


def _golden_inputs() -> FigureInputs:
    return FigureInputs(
        runs=pd.read_csv(GOLDEN_TABLES / "runs.csv", dtype={"run_id": str}),
        steps=pd.read_csv(GOLDEN_TABLES / "steps.csv", dtype={"run_id": str}),
        comparison=pd.read_csv(GOLDEN_TABLES / "comparison.csv"),
        decomposition=pd.read_csv(GOLDEN_TABLES / "decomposition.csv", dtype={"run_id": str}),
    )


def _golden_figures(drawn: list[Any]) -> dict[str, Any]:
    """Every figure the merged golden tables (real CPU runs, one per setting) make, by name."""
    inputs = _golden_inputs()
    names = []
    for fig in FIGURES:
        if fig.merged_only and fig.name in RUN_FIGURES:
            fig.draw(fig.prepare(inputs), [], **fig.options(inputs))
            names.append(fig.name.value)
    assert len(drawn) == len(names)
    return dict(zip(names, drawn, strict=True))


def _texts(fig: Any) -> list[Any]:
    from matplotlib.text import Text

    fig.draw_without_rendering()
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def _small_texts(fig: Any) -> list[tuple[str, float]]:
    return [(t.get_text(), t.get_fontsize()) for t in _texts(fig) if t.get_fontsize() < 8]


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_text_is_smaller_than_8_pt(name: str, drawn: list[Any], tmp_path: Path) -> None:
    CASES[name][0](tmp_path)
    (fig,) = drawn
    assert plots.SMALL >= 8
    assert not _small_texts(fig), name


def test_the_demos_figures_print_every_text_at_8_pt_or_more_unclipped(drawn: list[Any]) -> None:
    figs = _golden_figures(drawn)
    assert set(figs) >= {"component_durations", "policy_heatmap", "decomposition"}
    for name, fig in figs.items():
        assert not _small_texts(fig), name
        renderer = fig.canvas.get_renderer()
        for t in _texts(fig):
            clip = t.get_clip_box() if t.get_clip_on() else None
            if clip is not None:
                box = t.get_window_extent(renderer)
                assert clip.x0 <= box.x0 and box.x1 <= clip.x1, (name, t.get_text())


def _overlapping_ticks(ax: Any) -> list[tuple[str, str]]:
    renderer = ax.figure.canvas.get_renderer()
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in labels]
    return [
        (labels[i].get_text(), labels[j].get_text())
        for i in range(len(boxes))
        for j in range(i + 1, len(boxes))
        if boxes[i].overlaps(boxes[j])
    ]


def test_the_demos_tick_labels_never_print_over_each_other(drawn: list[Any]) -> None:
    figs = _golden_figures(drawn)
    for name in ("component_durations", "step_time_distributions", "decomposition"):
        fig = figs[name]
        fig.draw_without_rendering()
        renderer = fig.canvas.get_renderer()
        panels = [ax for ax in fig.axes if any(t.get_text() for t in ax.get_xticklabels())]
        for ax in panels:
            assert not _overlapping_ticks(ax), name
        # Nor over the next panel's: each panel's labels stay within its own column.
        spans = sorted(
            (
                min(t.get_window_extent(renderer).x0 for t in ax.get_xticklabels()),
                max(t.get_window_extent(renderer).x1 for t in ax.get_xticklabels()),
            )
            for ax in panels
        )
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), name


def test_heatmap_cell_texts_stay_inside_their_cells(drawn: list[Any]) -> None:
    # The demo's cell "187 compute+comm" lost its leading digit past the axes' edge; a
    # throughput of four digits and a busy two-rank row are wider still.
    table = pd.DataFrame(
        {
            "row": ["none x2 ranks no pin", "none x2 ranks no pin", "shared no pin"],
            "policy": ["none", "none", "shared"],
            "workers": [0, 1, 2],
            "mode": ["compute+comm", "combined", "data+sleep"],
            "throughput_samples_s": [187.0, 1234.0, 99.0],
            "runs": [1, 1, 12],
            "busy_runs": [1, 1, 0],
            "ratio": [np.nan, 0.27, 1.8],
            "ci_low": [np.nan, 0.2, 1.5],
            "ci_high": [np.nan, 0.6, 2.2],
            "n_runs": [np.nan, 1, 12],
            "n_isolation_runs": [np.nan, 1, 10],
            "busy": [False, True, False],
        }
    )
    plots.policy_heatmap(table, [])
    (fig,) = drawn
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    texts = []
    for ax in fig.axes[:2]:
        frame = ax.get_window_extent(renderer)
        for t in ax.texts:
            j, i = t.get_position()
            (x0, y0), (x1, y1) = ax.transData.transform([(j - 0.5, i - 0.5), (j + 0.5, i + 0.5)])
            box = t.get_window_extent(renderer)
            inside = min(x0, x1) < box.x0 and box.x1 < max(x0, x1)
            assert inside and min(y0, y1) < box.y0 and box.y1 < max(y0, y1), t.get_text()
            assert frame.x0 < box.x0 and box.x1 < frame.x1, t.get_text()
            texts.append(t.get_text())
    assert "187\ncompute+comm\n(1 run)\n1 busy CPUs!" in texts
    assert "1,234\ncombined\n(1 run)\n1 busy CPUs!" in texts
    assert not _small_texts(fig)


def test_the_heatmap_claims_an_interval_only_over_runs(drawn: list[Any]) -> None:
    one = heatmap().assign(ci_low=0.5, ci_high=3.0, n_runs=1, n_isolation_runs=1, runs=1)
    plots.policy_heatmap(one, [])
    ratio = drawn[0].axes[1]
    cells = [t.get_text() for t in ratio.texts if t.get_text() != "no pair"]
    # One run an arm: the bootstrap resamples that run's steps only, and no cell shows it.
    assert cells and not any("[" in c for c in cells)
    assert all("(1/1 runs)" in c for c in cells)
    assert "CI" not in ratio.get_title() and "no interval" in ratio.get_title()
    mixed = one.assign(n_runs=[3, 1, 3, 3], n_isolation_runs=[3, 3, 2, 2])
    plots.policy_heatmap(mixed, [])
    ratio = drawn[1].axes[1]
    cells = {t.get_text().split("\n")[0]: t.get_text() for t in ratio.texts}
    assert "[0.50, 3.00]" in cells["2.20"] and "[" not in cells["2.50"]
    assert ">= 2 runs" in ratio.get_title() and "CI" in ratio.get_title()


def _whiskers(ax: Any) -> int:
    """Error bars drawn with a length (a NaN interval draws no segment)."""
    n = 0
    for c in ax.containers:
        if getattr(c, "errorbar", None) is not None:
            for lines in c.errorbar.lines[2]:
                n += sum(1 for seg in lines.get_segments() if len(seg))
    return n


def test_component_durations_claims_no_interval_over_one_run(drawn: list[Any]) -> None:
    head = comparison().assign(
        isolation_ci_low=lambda d: d["isolation"] * 0.9,
        isolation_ci_high=lambda d: d["isolation"] * 1.1,
        combined_ci_low=lambda d: d["combined"] * 0.8,
        combined_ci_high=lambda d: d["combined"] * 1.3,
        n_runs=1,
        n_isolation_runs=1,
        steps=8,
        isolation_steps=8,
    )
    plots.component_durations(head, [])
    (fig,) = drawn
    title = fig.get_suptitle()
    assert "CI" not in title and "bootstrap" not in title
    assert "1 run and 8 steps per bar" in title and "no interval" in title
    # The change labels read "(p50 ...)": the title names parentheses, not brackets.
    assert "in parentheses" in title and "bracket" not in title
    assert all(_whiskers(ax) == 0 for ax in fig.axes)
    # Labels then sit on the bars themselves, not on a whisker nobody sees.
    d = head[head["metric"] == "compute_eff_ms"]
    assert sorted(t.xy[1] for t in fig.axes[0].texts) == sorted(d["combined"])


def test_component_durations_names_the_interval_where_bars_have_runs(drawn: list[Any]) -> None:
    head = comparison().assign(
        isolation_ci_low=lambda d: d["isolation"] * 0.9,
        isolation_ci_high=lambda d: d["isolation"] * 1.1,
        combined_ci_low=lambda d: d["combined"] * 0.8,
        combined_ci_high=lambda d: d["combined"] * 1.3,
        n_runs=[3] * 4 + [1] * 8,
        n_isolation_runs=2,
        steps=600,
        isolation_steps=400,
    )
    plots.component_durations(head, [])
    (fig,) = drawn
    title = fig.get_suptitle()
    assert "1-3 runs and 400-600 steps per bar" in title
    assert "95 % two-level bootstrap CI (runs, then steps) on bars of >= 2 runs" in title
    # 3 pairs a panel: 3 isolation bars of 2 runs, 1 combined bar of 3 runs.
    assert all(_whiskers(ax) == 4 for ax in fig.axes)
