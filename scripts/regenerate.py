"""Regenerate every table a committed result set derives from its tables, into OUT.

    python scripts/regenerate.py OUT [--results results] [--against OTHER_OUT]

For each ``results/<set>/`` with merged tables: the comparison and decomposition again from
``runs.csv`` and ``steps.csv.gz`` (``steps.analysis.recompare_tables``), the frame each run
figure shows (its registered ``prepare``), ``codl advise`` with ``--out`` and
``--cross-validate`` as a user types it, the advisor's workflow step (``advise_to``) and the
interference map where the set's config has them, and every committed prediction scored
against the set's runs. A step that fails leaves ``<name>.err`` with its error, so that a
refactoring that changes an error is seen too.

``--against`` compares OUT with an earlier OUT byte for byte (made by the code before a change)
and exits 1 on any difference: "the move changed nothing" is this check, not a belief.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import yaml

from codl.advisor.verify import prediction_summary, score_predictions
from codl.figures import RUN_FIGURES
from codl.figures.registry import BY_NAME
from codl.steps import advisor as advisor_steps
from codl.steps.analysis import merged_inputs, recompare_tables


def _attempt(out: Path, name: str, step: Callable[[], object]) -> None:
    try:
        step()
    except Exception as exc:  # the error itself is an output to compare
        (out / f"{name}.err").write_text(repr(exc))


def _tables(s: Path, o: Path) -> None:
    shutil.copy(s / "tables" / "runs.csv", o / "runs.csv")
    shutil.copy(s / "tables" / "steps.csv.gz", o / "steps.csv.gz")
    kw = {
        "runs_table": o / "runs.csv",
        "steps_table": o / "steps.csv.gz",
        "comparison_table": o / "comparison.csv",
        "decomposition_table": o / "decomposition.csv",
    }
    recompare_tables(**kw)
    inputs = merged_inputs(**kw)
    for name in RUN_FIGURES:
        if BY_NAME[name].merged_only:
            BY_NAME[name].prepare(inputs).to_csv(o / f"fig_{name}.csv", index=False)


def _advise(s: Path, o: Path) -> None:
    cmd = [sys.executable, "-m", "codl.cli", "advise", str(s), "--out", str(o / "verify.yaml")]
    r = subprocess.run(
        [*cmd, "--cross-validate", str(o / "model_cv.csv")],
        capture_output=True,
        text=True,
        check=False,
    )
    (o / "advise.out").write_text(f"{r.stdout}\n--stderr--\n{r.stderr}\nrc={r.returncode}")
    if not (s / "config.yaml").is_file():
        return
    cfg = yaml.safe_load((s / "config.yaml").read_text())
    t = s / "tables"
    if (t / "interference_map.csv").is_file():
        _attempt(
            o,
            "map",
            lambda: advisor_steps.map_to(
                runs=t / "runs.csv",
                steps=t / "steps.csv.gz",
                cfg=cfg,
                table=o / "interference_map.csv",
                figures=[],
            ),
        )
    _attempt(
        o,
        "advise_to",
        lambda: advisor_steps.advise_to(
            runs=t / "runs.csv",
            steps=t / "steps.csv.gz",
            cfg=cfg,
            text=o / "advise_to.txt",
            verify=o / "advise_to.yaml",
            predictions=o / "advise_to_pred.csv",
        ),
    )


def _predictions(s: Path, o: Path) -> None:
    t = s / "tables"
    for pred in [s / "predicted.csv", *sorted(s.glob("alloc-*/predicted.csv"))]:
        if not pred.is_file():
            continue
        name = f"pvm_{pred.parent.name}"

        def score(pred: Path = pred, name: str = name) -> None:
            runs, steps = pd.read_csv(t / "runs.csv"), pd.read_csv(t / "steps.csv.gz")
            p = score_predictions(pd.read_csv(pred), runs, steps)
            p.to_csv(o / f"{name}.csv", index=False)
            pd.Series(prediction_summary(p)).to_csv(o / f"{name}_summary.csv")

        _attempt(o, name, score)


def regenerate(results: Path, out: Path) -> None:
    for s in sorted(p for p in results.iterdir() if p.is_dir()):
        if (
            not (s / "tables" / "runs.csv").is_file()
            or not (s / "tables" / "steps.csv.gz").is_file()
        ):
            continue
        o = out / s.name
        o.mkdir(parents=True, exist_ok=True)
        _attempt(o, "recompare", lambda s=s, o=o: _tables(s, o))
        _advise(s, o)
        _predictions(s, o)
        print(f"{s.name}: {len(list(o.iterdir()))} files")


def differences(a: Path, b: Path) -> list[str]:
    names = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    names |= {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    return sorted(
        str(n)
        for n in names
        if not (
            (a / n).is_file() and (b / n).is_file() and filecmp.cmp(a / n, b / n, shallow=False)
        )
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--results", type=Path, default=Path("results"))
    p.add_argument("--against", type=Path, help="an earlier OUT to compare with, byte for byte")
    args = p.parse_args()
    regenerate(args.results, args.out)
    if args.against is None:
        return 0
    diff = differences(args.against, args.out)
    print(f"{len(diff)} file(s) differ from {args.against}" + "".join(f"\n  {d}" for d in diff))
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
