"""The workflow's DAG cost: a dry-run of a 1,000-run matrix against a minimal Snakefile with the
same job graph, and where the workflow's time goes.

Writes a config whose one experiment expands to ``--runs`` runs (the smoke defaults, factors
mode x policy x workers, and repeats), generates a minimal Snakefile with the same rules, wildcards,
files and jobs (every path and per-run value a literal, no codl import), and times
``snakemake -n`` of both, alternating, best of ``--repeat`` (and the paired median of the
rounds' ratios, through ``codl.measure``, which also writes the CSV). Then profiles the workflow's
dry-run once (cProfile) and prints the cumulative time of its parts: codl's plan (config checks,
matrix expansion, spec hashing), the input/params/resource functions of common.smk, the config
schema validation, and file-system checks (stat).

    .venv/bin/python benchmarks/dag_cost.py [--runs 1000] [--repeat 3] [--csv PATH]
"""

from __future__ import annotations

import argparse
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from codl.config import load_plan, load_yaml
from codl.figures import plan_figures
from codl.measure import Recorder, table
from codl.paths import FIGURE_FORMATS, ResultPaths, set_name_of
from codl.steps.workflow import dataset_input

ROOT = Path(__file__).resolve().parents[1]
SNAKEFILE = ROOT / "workflow" / "Snakefile"
DEFAULT_CSV = Path(__file__).parent / "results" / "dag_cost.csv"
WORKERS = (1, 2, 3, 4, 5)
MODES = ("data", "combined")
POLICIES = ("none", "shared")


def write_config(directory: Path, runs: int) -> Path:
    cfg = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text(encoding="utf-8"))
    per_repeat = len(WORKERS) * len(MODES) * len(POLICIES)
    cfg["experiments"] = [
        {
            "name": "dag",
            "factors": {
                "mode": list(MODES),
                "pinning.policy": list(POLICIES),
                "loader.workers": list(WORKERS),
            },
            "repeats": max(1, runs // per_repeat),
        }
    ]
    path = directory / "dag.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def minimal_snakefile(config: Path) -> str:
    """The same jobs as the workflow, with every per-run value computed here, once."""
    plan = load_plan(config)
    p = ResultPaths(set_name=set_name_of(load_yaml(config), [config]))
    specs = plan.specs  # a property that re-derives every run_id: once
    ids = sorted(specs)
    datasets = sorted({name for name, _tier in plan.datasets()})
    inputs = {i: dataset_input(p, specs[i]) for i in ids}
    figures = [str(p.figure(n, f)) for n in plan_figures(specs.values()) for f in FIGURE_FORMATS]
    tables = [str(p.runs_table), str(p.comparison_table), str(p.decomposition_table)]

    per_run_outputs = [
        str(getattr(p, k)("{run_id}")) for k in ("steps", "summary", "attribution", "parts")
    ]

    def each(kind: str) -> list[str]:
        return [str(getattr(p, kind)(i)) for i in ids]

    return f"""
IDS = {ids!r}
DATA = {inputs!r}
rule all:
    input: {tables + figures!r}
rule dataset:
    output: "{p.dataset_manifest("{dataset}")}"
    shell: "touch {{output}}"
rule spec:
    output: "{p.spec("{run_id}")}"
    shell: "touch {{output}}"
rule run:
    input: spec="{p.spec("{run_id}")}", dataset=lambda w: DATA[w.run_id]
    output: "{p.trace("{run_id}")}"
    shell: "touch {{output}}"
rule summarize:
    input: "{p.trace("{run_id}")}"
    output: {per_run_outputs!r}
    shell: "touch {{output}}"
rule compare:
    input: {each("summary") + each("steps") + each("attribution") + each("parts")!r}
    output: {[*tables, str(p.steps_table), str(p.attribution_table)]!r}
    shell: "touch {{output}}"
rule figures:
    input: {[*tables, str(p.steps_table), *each("trace")]!r}
    output: {figures!r}
    shell: "touch {{output}}"
# {len(datasets)} data set(s)
"""


def dry_run(args: list[str], cwd: Path) -> float:
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "2", "-q", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"snakemake -n {args} failed:\n{proc.stderr[-3000:]}")
    return elapsed


PARTS = {
    "codl plan (checks, expansion, spec hashing)": ("codl/config.py", "build_plan"),
    "spec hashing alone": ("codl/spec.py", "run_id"),
    "common.smk input/params/resources": ("common.smk", "get_"),
    "config schema validation": ("snakemake/utils.py", "validate"),
    "file checks (stat)": ("~", "<built-in method posix.stat>"),
}


def profile(config: Path, cwd: Path) -> dict[str, float]:
    out = cwd / "dag.prof"
    code = (
        "import sys, cProfile; from snakemake.cli import main; "
        f"sys.argv=['snakemake','-n','--cores','2','-q','--snakefile',{str(SNAKEFILE)!r},"
        f"'--configfile',{str(config)!r}]; cProfile.run('main()', {str(out)!r})"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    stats: Any = pstats.Stats(str(out)).stats
    result: dict[str, float] = {}
    for label, (file_part, func) in PARTS.items():
        # Cumulative time of the outermost matching frames (callers outside the set).
        keys = [
            k
            for k in stats
            if file_part in k[0] and (k[2] == func or (func == "get_" and k[2].startswith(func)))
        ]
        own = set(keys)
        total = 0.0
        for k in keys:
            callers = stats[k][4]
            if not any(c in own for c in callers):
                total += stats[k][3]
        result[label] = total
    result["total (profiled)"] = max(v[3] for v in stats.values())
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="codl-dag-") as tmp:
        work = Path(tmp)
        config = write_config(work, args.runs)
        minimal = work / "Minimal.smk"
        minimal.write_text(minimal_snakefile(config), encoding="utf-8")
        runs = len(load_plan(config).specs)
        real_args = ["--snakefile", str(SNAKEFILE), "--configfile", str(config)]
        times: dict[str, list[float]] = {"workflow": [], "minimal": []}
        for _ in range(args.repeat):
            times["workflow"].append(dry_run(real_args, work))
            times["minimal"].append(dry_run(["--snakefile", str(minimal)], work))
        parts = profile(config, work)
    rec = Recorder()
    # Each round ran the workflow then the minimal Snakefile: round i of each is a pair.
    wf, mini = (
        rec.add("snakemake -n", times[k], unit="s", statistic="process", snakefile=k, runs=runs)
        for k in ("workflow", "minimal")
    )
    paired = rec.paired(wf, mini, "workflow / minimal")
    for label, seconds in parts.items():
        rec.add(label, [seconds], unit="s", statistic="cProfile cumulative", snakefile="workflow")
    # "Best of": the fastest round is the one least disturbed by the machine's other work.
    ratio = wf.min / mini.min
    print(f"# snakemake -n of {runs} runs ({3 * runs + 3} jobs), best of {args.repeat}")
    print(f"{'workflow':<12} {wf.min:>8.2f} s")
    print(f"{'minimal':<12} {mini.min:>8.2f} s")
    print(f"{'ratio':<12} {ratio:>8.2f}   (target <= 1.5)")
    print("# where the workflow's dry-run spends its time (cProfile, cumulative):")
    for label, seconds in parts.items():
        print(f"  {label:<46} {seconds:>7.2f} s")
    print(f"# workflow / minimal: {paired.describe()}")
    print(table([wf, mini, paired], column="snakefile", baseline="minimal"))
    rec.write(args.csv)
    print(f"# wrote {args.csv}")


if __name__ == "__main__":
    main()
