"""Out-of-sample checks of fitted throughput models: predict a check config's runs before they
run, then set the predictions against the measured runs.

    python scripts/check_fit.py predict CHECK.yaml OUT.csv FIT_RESULTS...
        one row per run setting of CHECK.yaml, predicted by the fit (a results directory, as
        `codl advise` reads it) whose data set it reads: a `data` run's loader capacity, a
        combined run's throughput; with 95 % model and one-run intervals
    python scripts/check_fit.py compare PREDICTED.csv CHECK.yaml CHECK_RESULTS OUT.csv
        each prediction with its runs' measured per-rank throughput: `delivered` (what the
        window delivered) and `measured` (the model's reading: the workers' production where the
        window drained batches made before it), the error against `measured`, and whether the
        intervals hold it

    python scripts/check_fit.py holdout RESULTS CORES OUT.csv
        the combined runs on CORES cores held out: predicted by the fit on the rest, and by a
        fit whose data runs had only the combined runs' budget
    python scripts/check_fit.py splits CORES OUT.csv FIT_RESULTS...
        the advisor's split of CORES cores between the fitted jobs, every split scored
    python scripts/check_fit.py alloc FIT.yaml CHECK.yaml SECONDS OUT_DIR
        on one machine, without Snakemake: FIT's runs, the model fitted on them, CHECK's
        settings predicted (OUT_DIR/predicted.csv) before CHECK's runs start, then those runs
        and the comparison; no run starts after SECONDS
    python scripts/check_fit.py share SHARE_CONFIG.yaml OUT.csv
        each job of a share config at its configured setting, predicted on its share of the
        even and of the advised split of the pool, before the experiment runs

Made results/fit-h200-check/predicted.csv, its tables/predicted_vs_measured.csv and
tables/advised_splits.csv, and results/fit-h200-light/tables/held_out_8_cores.csv
(docs/advisor.md, "Two core budgets").
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from codl.advisor import advise as adv
from codl.advisor import model as mdl
from codl.advisor.settings import share_settings, share_specs
from codl.config import build_plan, load_yaml
from codl.paths import ResultPaths
from codl.steps.advisor import fit_results
from codl.steps.share import even_counts

KEY = ["experiment", "mode", "dataset", "policy", "workers", "cores"]


def settings_of(check: Path) -> pd.DataFrame:
    """One row per run of CHECK.yaml: its ``run_id`` and setting (``KEY``)."""
    cfg = load_yaml(check)
    plan = build_plan(cfg)
    default = int((cfg.get("slurm") or {}).get("cpus_per_rank", 0))
    rows = []
    for experiment, ids in plan.experiments().items():
        for run_id in ids:
            s = plan.specs[run_id]
            rows.append(
                {
                    "run_id": run_id,
                    "experiment": experiment,
                    "mode": s.mode.value,
                    "dataset": s.dataset.name,
                    "policy": s.pinning.policy.value,
                    "workers": s.loader.workers,
                    "cores": s.pinning.cpus or default,
                }
            )
    return pd.DataFrame(rows)


def predict(check: Path, out: Path, fits: list[Path]) -> None:
    by_dataset = {}
    for d in fits:
        name = load_yaml(d / "config.yaml")["defaults"]["dataset"]["name"]
        by_dataset[name] = fit_results(d, boot=200).fit
    settings = settings_of(check).drop(columns="run_id").drop_duplicates()
    rows = []
    for (dataset, mode), s in settings.groupby(["dataset", "mode"], sort=False):
        fit = by_dataset[str(dataset)]
        if mode == mdl.LOADER_MODE:
            p = mdl.predict_loader(fit, s)
            cols = ("loader_capacity", "loader_capacity_lo", "loader_capacity_hi")
        else:
            p = mdl.predict(fit, s)
            cols = ("throughput", "throughput_lo", "throughput_hi")
        p = p.assign(**{n: p[c] for n, c in zip(("predicted", "lo", "hi"), cols, strict=True)})
        rows.append(p[[*KEY, "predicted", "lo", "hi", "pred_lo", "pred_hi"]])
    pd.concat(rows).to_csv(out, index=False, float_format="%.1f")


def compare(predicted: Path, check: Path, results: Path, out: Path) -> None:
    runs, steps = (pd.read_csv(p) for p in ResultPaths.merged_tables_of(results))
    data = mdl.run_data(runs, steps)
    batch = data.node.batch
    r = settings_of(check)
    r = r[r["run_id"].isin(data.step_ms)].copy()
    r["delivered"] = [batch * 1000.0 / float(data.step_ms[i].mean()) for i in r["run_id"]]
    r["measured"] = [mdl.measured_throughput(data, i) for i in r["run_id"]]
    got = r.groupby(KEY)[["delivered", "measured"]].mean()
    got["n_runs"] = r.groupby(KEY).size()
    table = pd.read_csv(predicted).merge(got.reset_index(), on=KEY, how="left")
    table["error"] = table["predicted"] / table["measured"] - 1
    table["error_vs_delivered"] = table["predicted"] / table["delivered"] - 1
    table["inside_model_ci"] = table["measured"].between(table["lo"], table["hi"])
    table["inside_one_run"] = table["measured"].between(table["pred_lo"], table["pred_hi"])
    table.to_csv(out, index=False, float_format="%.4g")
    print(table.to_string())


def holdout(results: Path, cores: int, out: Path) -> None:
    """The combined runs on ``cores`` cores held out, predicted by the fit on every other run
    (the data runs at all their budgets) and by the fit on the data runs at the combined runs'
    budget only (what a one-budget config would have had)."""
    fitted = fit_results(results, boot=0)
    runs, steps, fit_cores = fitted.runs, fitted.steps, fitted.fit.cores
    held = runs[(runs["mode"] != mdl.LOADER_MODE) & (runs["cpus"] == cores) & (runs["workers"] > 0)]
    rest = runs[~runs["run_id"].isin(held["run_id"])]
    one = rest[(rest["mode"] != mdl.LOADER_MODE) | (rest["cpus"] == fit_cores)]
    data = mdl.run_data(runs, steps)
    measured = [mdl.measured_throughput(data, str(i)) for i in held["run_id"]]
    rows = []
    for name, kept in (("data runs at every budget", rest), (f"data runs at {fit_cores}", one)):
        fit = mdl.fit(mdl.run_data(kept, steps), cores=fit_cores, boot=200, seed=0)
        table = fit.parameters().set_index("parameter")
        settings = held[["policy", "workers"]].assign(cores=cores).drop_duplicates()
        p = mdl.predict(fit, settings).iloc[0]
        rows.append(
            {
                "fit": name,
                "kappa": fit.params.kappa,
                "kappa_lo": table.loc["kappa", "lo"],
                "kappa_hi": table.loc["kappa", "hi"],
                "ceiling": fit.params.ceiling,
                "workers": int(p["workers"]),
                "cores": cores,
                "predicted": p["throughput"],
                "lo": p["throughput_lo"],
                "hi": p["throughput_hi"],
                "bound": p["bound"],
                "measured": sum(measured) / len(measured),
                "n_runs": len(measured),
                "error": p["throughput"] / (sum(measured) / len(measured)) - 1,
            }
        )
    table = pd.DataFrame(rows)
    table.to_csv(out, index=False, float_format="%.4g")
    print(table.to_string())


def splits(fits: list[Path], cores: int, out: Path) -> None:
    """``advise.advise_split`` of ``cores`` between the fitted jobs, every split scored."""
    counts, table = adv.advise_split([fit_results(d, boot=200).fit for d in fits], cores=cores)
    table = table.assign(split=[" / ".join(map(str, x)) for x in table["split"]])
    table.to_csv(out, index=False, float_format="%.4g")
    print("advised:", counts)
    print(table.to_string())


def share_plan(config: Path, out: Path) -> None:
    """Each job of CONFIG's ``share`` section at its configured workers and policy, predicted
    by its fit (``share.advise_from``) on its share of the even and of the advised split of the
    pool (``share.cpus``, else ``slurm.cpus_per_rank``); per job, advised over even."""
    cfg = load_yaml(config)
    settings = share_settings(cfg)
    specs = share_specs(cfg, build_plan(cfg))
    fits = [fit_results(Path(d), boot=200).fit for d in settings.advise_from]
    pool = settings.cpus or int(cfg["slurm"]["cpus_per_rank"])
    advised, _ = adv.advise_split(fits, cores=pool)
    rows = []
    for split, counts in (("even", even_counts(pool, len(fits))), ("advised", advised)):
        for (job, spec), fit, cores in zip(specs.items(), fits, counts, strict=True):
            setting = pd.DataFrame(
                {"policy": [spec.pinning.policy.value], "workers": [spec.loader.workers]}
            ).assign(cores=cores)
            p = mdl.predict(fit, setting).iloc[0]
            rows.append(
                {
                    "pool": pool,
                    "split": split,
                    "job": job,
                    "cores": cores,
                    "workers": spec.loader.workers,
                    **{c: p[c] for c in ("throughput", "throughput_lo", "throughput_hi")},
                    **{c: p[c] for c in ("pred_lo", "pred_hi", "bound")},
                }
            )
    table = pd.DataFrame(rows)
    even = table[table["split"] == "even"].set_index("job")["throughput"]
    table["vs_even"] = table["throughput"] / table["job"].map(even) - 1
    table.to_csv(out, index=False, float_format="%.4g")
    print(table.to_string())


def run_config(config: Path, results: Path, deadline: float, ids: list[str] | None = None) -> int:
    """Every run of ``config`` in plan order (or the runs ``ids``, in their order), without
    Snakemake (a GPU node may not have it), into ``results`` as the workflow lays it out:
    ``config.yaml`` and ``tables/runs.csv``, ``tables/steps.csv.gz``; no run starts after
    ``deadline`` (``time.time()``). The data sets are generated once per machine under $TMPDIR.
    Returns the runs measured."""
    import shutil
    import tempfile
    import time

    from codl.analysis.summarize import summarize_trace
    from codl.datasets import generate
    from codl.harness.launch import launch

    plan = build_plan(load_yaml(config))
    tables = results / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    shutil.copy(config, results / "config.yaml")
    work = Path(tempfile.gettempdir()) / "codl-check-fit"
    runs, steps = [], []
    for run_id in plan.specs if ids is None else ids:
        spec = plan.specs[run_id]
        if time.time() > deadline:
            print(f"{config}: deadline reached before {run_id}", flush=True)
            break
        data = work / "data" / spec.dataset.name
        if spec.mode.loads and not data.exists():
            generate(spec.dataset, data)
        trace = work / "runs" / run_id / "trace.h5"
        trace.parent.mkdir(parents=True, exist_ok=True)
        launch(spec, trace_path=trace, dataset_dir=data if spec.mode.loads else None)
        st, summary, _ = summarize_trace(trace)
        runs.append(summary)
        steps.append(st)
        print(f"{run_id}: {summary['throughput_samples_s'].iloc[0]:.0f} samples/s", flush=True)
        # Written after each run: a call cut at its limit keeps what it measured.
        pd.concat(runs).to_csv(tables / "runs.csv", index=False)
        pd.concat(steps).to_csv(tables / "steps.csv.gz", index=False)
    return len(runs)


def alloc(fit_config: Path, check: Path, seconds: float, out: Path) -> None:
    """On a machine of its own (one allocation of a GPU node): the fit's runs, the model fitted
    on them, the check's settings predicted and written (``out/predicted.csv``) before the
    check's runs start, then those runs and the comparison (``out/predicted_vs_measured.csv``).
    A fit and a check on one machine: the interference and the CPU's speed belong to the machine
    (docs/advisor.md, "The tie rule")."""
    import shutil
    import time

    deadline = time.time() + seconds
    run_config(fit_config, out / "fit", deadline)
    predict(check, out / "predicted.csv", [out / "fit"])
    print(pd.read_csv(out / "predicted.csv").to_string(), flush=True)
    if run_config(check, out / "check", deadline):
        compare(out / "predicted.csv", check, out / "check", out / "predicted_vs_measured.csv")
    # Flat copies of the tables: a job runner may return only files near the top of its
    # output folder (allocation B's tables/ did not come back).
    for part in ("fit", "check"):
        for table in ("runs.csv", "steps.csv.gz"):
            if (out / part / "tables" / table).exists():
                shutil.copy(out / part / "tables" / table, out / f"{part}-{table}")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "predict":
        predict(Path(args[0]), Path(args[1]), [Path(a) for a in args[2:]])
    elif cmd == "compare":
        compare(Path(args[0]), Path(args[1]), Path(args[2]), Path(args[3]))
    elif cmd == "holdout":
        holdout(Path(args[0]), int(args[1]), Path(args[2]))
    elif cmd == "splits":
        splits([Path(a) for a in args[2:]], int(args[0]), Path(args[1]))
    elif cmd == "share":
        share_plan(Path(args[0]), Path(args[1]))
    elif cmd == "alloc":
        alloc(Path(args[0]), Path(args[1]), float(args[2]), Path(args[3]))
    else:
        sys.exit(
            f"usage: {sys.argv[0]} predict CHECK.yaml OUT.csv FIT... | "
            "compare PREDICTED.csv CHECK.yaml CHECK_RESULTS OUT.csv | "
            "holdout RESULTS CORES OUT.csv | splits CORES OUT.csv FIT... | "
            "share SHARE_CONFIG.yaml OUT.csv | alloc FIT.yaml CHECK.yaml SECONDS OUT_DIR"
        )
