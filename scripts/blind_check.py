"""Blind check of the calibration on a machine other than the fit's (issue 35; docs/advisor.md,
"Calibration on a new machine"), on one node without Snakemake (the GPU node we had):

    python3 scripts/blind_check.py FIT OUT [--seconds S] [--cores N] [--steps N]

1. the fit's probe config (``codl advise FIT --probe-out``: three runs chosen by the model);
2. the probe's runs, measured here;
3. ``codl advise FIT --calibrate`` on them: the calibrated advice, its verification config
   (the advice, its neighbours and the fit's best setting) and the calibrated predictions of
   its settings, whose sha256 and time the config records; the uncalibrated fit's predictions
   of the same settings with their sha256 and time beside them. All of it goes into
   ``OUT/plan.tar`` before any verification run starts;
4. the verification config's combined runs, repeat-major, the advised setting first in each
   repeat, until S seconds from the start (no run starts later); compute twins and loader runs
   are left out (the blind error is about the combined settings).

OUT gets five files: ``plan.tar``, ``probe_runs.csv``, ``probe_steps.csv.gz``,
``verify_runs.csv``, ``verify_steps.csv.gz`` (the tables rewritten after each run, so a call
cut at its limit keeps what it measured; the rest stays under $TMPDIR).
``scripts/blind_table.py OUT TABLE.csv`` makes the blind error table from them. On CPU, with
a CPU fit (its config's defaults a CPU workload) and ``--cores`` this machine's budget, the
same steps run end to end (tests/test_blind_check.py).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_fit import run_config

from codl import cli
from codl.advisor import model as mdl
from codl.config import build_plan, load_yaml
from codl.steps.advisor import fit_results

#: What plan.tar holds: written before the verification's runs, read by blind_table.py.
PLAN_FILES = (
    "probe.yaml",
    "calibration.csv",
    "advice.txt",
    "verify.yaml",
    "predictions.csv",
    "predictions_uncalibrated.csv",
    "uncalibrated.json",
)


def _advise(*args: str) -> None:
    rc = cli.main(["advise", *args])
    if rc != 0:
        sys.exit(f"blind_check: codl advise {' '.join(args)} failed ({rc})")


def uncalibrated_predictions(fit_dir: Path, plan_dir: Path) -> None:
    """The uncalibrated fit's prediction of every setting of the calibrated predictions, with
    the same ``advised`` flags, and its sha256 and time (uncalibrated.json)."""
    cal = pd.read_csv(plan_dir / "predictions.csv", dtype={"launch_cores": str})
    fit = fit_results(fit_dir, boot=200).fit
    grid = cal[["policy", "workers"]].copy()
    grid["launch_cores"] = pd.Series(
        [None if k in ("-", "auto") else int(k) for k in cal["launch_cores"]], dtype=object
    )
    out = mdl.predict(fit, grid)
    out["launch_cores"] = cal["launch_cores"]
    out["advised"] = cal["advised"]
    path = plan_dir / "predictions_uncalibrated.csv"
    out[list(cal.columns)].to_csv(path, index=False)
    record = {
        "predictions_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "predicted_at": datetime.datetime.now(tz=datetime.UTC).isoformat(),
    }
    (plan_dir / "uncalibrated.json").write_text(json.dumps(record, indent=1) + "\n")


def verification_order(verify: Path, predictions: Path, combined_mode: str) -> list[str]:
    """The verification config's combined runs, repeat-major, the advised setting's run first
    in each repeat (so the fewest runs that fit still score the advice against the others)."""
    plan = build_plan(load_yaml(verify))
    pred = pd.read_csv(predictions)
    row = pred[pred["advised"].astype(bool)].iloc[0]
    advised = (str(row["policy"]), int(row["workers"]))
    ranked = [
        (s.repeat, (s.pinning.policy.value, s.loader.workers) != advised, n, run_id)
        for n, (run_id, s) in enumerate(plan.specs.items())
        if s.mode.value == combined_mode
    ]
    return [run_id for *_, run_id in sorted(ranked)]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("fit", type=Path, help="the fit's results directory (committed)")
    p.add_argument("out", type=Path, help="where the five files go ($OUT)")
    p.add_argument("--seconds", type=float, default=250.0, help="no run starts after this")
    p.add_argument("--cores", type=int, help="core budget of the advice and probe")
    p.add_argument("--steps", type=int, help="measured steps of probe and verification runs")
    args = p.parse_args(argv)
    deadline = time.time() + args.seconds
    # The working files stay off OUT: only the five files come back from the node, and the
    # traces under the working directory go with it.
    with tempfile.TemporaryDirectory(prefix="blind-check-") as tmp:
        return _check(args, Path(tmp), deadline)


def _check(args: argparse.Namespace, work: Path, deadline: float) -> int:
    plan_dir = work / "plan"
    plan_dir.mkdir()
    args.out.mkdir(parents=True, exist_ok=True)
    extra = [*(["--cores", str(args.cores)] if args.cores else [])]
    extra += ["--steps", str(args.steps)] if args.steps else []
    fit = str(args.fit)
    _advise(fit, "--boot", "0", "--probe-out", str(plan_dir / "probe.yaml"), *extra)
    _link(work / "probe", args.out, "probe")
    measured = run_config(plan_dir / "probe.yaml", work / "probe", deadline)
    if measured < 3:
        sys.exit(f"blind_check: {measured} of the probe's 3 runs before the deadline")
    _advise(
        fit,
        "--calibrate",
        str(work / "probe"),
        "--probe-config",
        str(plan_dir / "probe.yaml"),
        "--calibration-table",
        str(plan_dir / "calibration.csv"),
        "--out",
        str(plan_dir / "verify.yaml"),
        "--predictions",
        str(plan_dir / "predictions.csv"),
        "--text",
        str(plan_dir / "advice.txt"),
        *extra,
    )
    uncalibrated_predictions(args.fit, plan_dir)
    with tarfile.open(args.out / "plan.tar", "w") as tar:
        for name in PLAN_FILES:
            tar.add(plan_dir / name, arcname=name)
    combined = fit_results(args.fit, boot=0).fit.node.combined_mode
    order = verification_order(plan_dir / "verify.yaml", plan_dir / "predictions.csv", combined)
    print(f"verification: {len(order)} combined runs planned, repeat-major", flush=True)
    _link(work / "verify", args.out, "verify")
    n = run_config(plan_dir / "verify.yaml", work / "verify", deadline, ids=order)
    print(f"verification: {n} of {len(order)} runs measured", flush=True)
    return 0


def _link(results: Path, out: Path, prefix: str) -> None:
    """``results``' tables as links to ``out/PREFIX_runs.csv`` and ``PREFIX_steps.csv.gz``:
    ``run_config`` rewrites them after each run, so a call cut at its limit still returns what
    it measured."""
    tables = results / "tables"
    tables.mkdir(parents=True)
    for name in ("runs.csv", "steps.csv.gz"):
        (tables / name).symlink_to((out / f"{prefix}_{name}").resolve())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
