"""Every figure writes a real PNG and PDF from small frames, and says why when it has no data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from codl.figures import data as figdata
from codl.figures import draw as plots
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


def test_decomposition_stacks_the_budget_up_to_the_inflation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figs = _drawn(monkeypatch)
    means = decomposition_means()
    means["host_source"] = "compute span"
    means.loc[means["policy"] == "isolated", "host_source"] = "whole step"
    plots.decomposition(means, outputs(tmp_path, "x"))
    ax = figs[0].axes[0]
    bars = [p for p in ax.patches if p.get_height() != 0]
    line = ax.collections[0].get_segments()
    for i, seg in enumerate(line):
        centre = (seg[0][0] + seg[1][0]) / 2
        mine = [p for p in bars if abs(p.get_x() + p.get_width() / 2 - centre) < 1e-9]
        # One bar per group: its parts, positive up and negative down, sum to the line.
        assert sum(p.get_height() for p in mine) == pytest.approx(seg[0][1]), i
    # The isolated groups' unattributed part is negative: drawn below zero.
    assert min(p.get_height() for p in bars) < 0
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "compute inflation (mean)" in legend
    assert any("unattributed" in t for t in legend)
    # GPU slowdown was not measured (NaN everywhere): no legend entry claims a zero.
    assert not any("GPU slowdown" in t for t in legend)
    assert "budget" in ax.get_title()
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert all("x2 ranks" in t and "20 steps" in t for t in labels)
    # A group whose host part covers the whole step says it is no budget; the others do not.
    assert ["not a budget" in t for t in labels] == list(means["host_source"] == "whole step")


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
