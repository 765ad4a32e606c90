"""Makespan of a queue sharing a node: on a planted queue the advised plan (re-split at every
event) reaches the lower bound of any schedule and beats the even split; the simulator keeps
time and samples; measured rates interpolate between budgets."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from codl.advisor import makespan as ms
from codl.advisor import model as mdl
from codl.figures.makespan import draw_makespan
from test_model import CORES, planted_tables


def hungry(c: int) -> float:
    return 100.0 * c  # a loader-bound job: every core adds 100 samples/s


def light(c: int) -> float:
    return 100.0 * min(c, 2)  # fed by 2 cores, more add nothing


RATES = {"hungry": hungry, "light": light}
QUEUE = [
    ms.Job(name="a", workload="hungry", samples=8000),
    ms.Job(name="b", workload="light", samples=1000),
]


def test_resplitting_beats_an_even_split_and_reaches_the_lower_bound() -> None:
    # 16 cores, 2 GPUs. Any schedule needs the hungry job's 80 core-seconds and the light job's
    # >= 10 (at most 100 samples/s per core, and it cannot run faster than 200 samples/s, so
    # >= 5 s): makespan >= max(90 / 16, 5) = 5.625 s.
    bound = (8000 / 100 + 1000 / 100) / 16
    times = {
        plan: ms.makespan(ms.simulate(QUEUE, cores=16, slots=2, plan=plan, planning=RATES))
        for plan in ms.Plan
    }
    # Even (8/8 for good): the hungry job at 800/s takes 10 s. Re-split evenly when the light
    # job ends at 5 s: 4000 left at 1600/s, 7.5 s. Advised: the light job its 2 cores, the hungry
    # one 14 (1400/s for 5 s), then all 16: 5 + 1000 / 1600 = 5.625 s, the bound.
    assert times[ms.Plan.EVEN] == pytest.approx(10.0)
    assert times[ms.Plan.EVEN_RESPLIT] == pytest.approx(7.5)
    assert times[ms.Plan.ADVISED] == pytest.approx(bound)
    s = ms.simulate(QUEUE, cores=16, slots=2, plan=ms.Plan.ADVISED, planning=RATES)
    first = s[s["start"] == 0].set_index("job")["cores"]
    assert (first["a"], first["b"]) == (14, 2)
    # Every job's samples are done, no segment uses more than the node's cores.
    assert s.groupby("job")["samples"].sum().to_dict() == pytest.approx({"a": 8000, "b": 1000})
    assert s.groupby("start")["cores"].sum().max() <= 16


def test_a_queue_waits_for_a_slot_and_plans_predicted_vs_simulated(tmp_path: Path) -> None:
    # Three jobs, 2 slots: the third starts when the first ends. Executed at rates 10 % lower
    # than planned, every schedule takes 1/0.9 as long (same decisions, slower jobs).
    queue = [*QUEUE, ms.Job(name="c", workload="light", samples=500)]
    slow = {k: (lambda c, f=f: 0.9 * f(c)) for k, f in RATES.items()}
    table, segments = ms.plan_table(
        queue,
        cores=16,
        slots=2,
        predicted=RATES,
        measured=slow,
        measured_budgets={"hungry": [16], "light": [2]},
    )
    t = table.set_index("plan")
    assert (t["simulated_s"] / t["predicted_s"]).to_numpy() == pytest.approx(1 / 0.9)
    assert t.loc["advised", "predicted_s"] < t.loc["even", "predicted_s"]
    assert t.loc["even", "predicted_vs_even"] == 0
    # Even: job c starts when b ends (5 s) in b's slot.
    even = segments[(segments["plan"] == "even") & (segments["kind"] == "predicted")]
    assert even.loc[even["job"] == "c", "start"].min() == pytest.approx(5.0)
    assert 0 <= t.loc["advised", "measured_share"] <= 1
    draw_makespan(table, segments, [tmp_path / "makespan.png"])
    assert (tmp_path / "makespan.png").stat().st_size > 0


def test_measured_rates_are_the_best_setting_per_budget_interpolated_between() -> None:
    runs, steps = planted_tables(small_budget=8, repeats=1, steps=20)
    data = mdl.run_data(runs, steps)
    table = ms.measured_rates(data)
    # The planted combined runs are all on 16 cores.
    assert list(table["cores"]) == [CORES]
    rate = ms.interpolated(pd.DataFrame({"cores": [4, 8], "throughput": [1000.0, 1800.0]}))
    assert rate(6) == pytest.approx(1400.0)
    assert rate(16) == pytest.approx(1800.0) and rate(2) == pytest.approx(500.0)


def test_bad_queues_are_refused() -> None:
    with pytest.raises(ms.MakespanError, match="empty queue"):
        ms.simulate([], cores=4, slots=1, plan=ms.Plan.EVEN, planning=RATES)
    with pytest.raises(ms.MakespanError, match="cores >= slots"):
        ms.simulate(QUEUE, cores=1, slots=2, plan=ms.Plan.EVEN, planning=RATES)
    with pytest.raises(ms.MakespanError, match="no rates"):
        ms.simulate(QUEUE, cores=4, slots=2, plan=ms.Plan.EVEN, planning={"light": light})
