"""The GIL intervention (issue 31): runs a config's runs in one block, interleaved, then reduces
them to the launch roles' sleeps per run and the compute inflation over blocks.

    python scripts/gil_experiment.py CONFIG WORKDIR OUT [--seconds S]
        every run of CONFIG (config/gil-h200.yaml), without Snakemake, into WORKDIR/runs/<id>/
        (a run already measured there is kept); no run starts after S seconds. Then, into OUT:
        the workflow's merged tables (runs.csv, steps.csv.gz, comparison.csv,
        decomposition.csv.gz), gil_runs.csv (one row per run: the factors, its compute and
        throughput, its launch roles' sleeps by what ended them) and gil_inflation.csv (per
        setting: the compute inflation of each block's pair, and over the blocks their geometric
        mean with a t interval).
    python scripts/gil_experiment.py --reduce CONFIG WORKDIR OUT   the second half alone
    python scripts/gil_experiment.py --pool OUT.csv RUNS.csv...
        gil_inflation of several calls' gil_runs.csv together: each loading run stays paired with
        its twin of its own block, and the blocks of every call count; with ring hand-off runs
        also OUT_throughput.csv (each ring setting over the best torch setting of its block), and
        where every RUNS.csv has its decomposition.csv.gz beside it, OUT.png (inflation per
        setting with a point per block; the host-blocked part per setting)
    python scripts/gil_experiment.py --stacks S CONFIG WORKDIR OUT
        after the runs: one more loading run at CPython's default interval, in its own process,
        while py-spy records for S seconds which thread holds the GIL and in what code
        (OUT/gil_stacks.txt, py-spy's raw collapsed stacks, one per thread: --gil --threads
        --native); where py-spy cannot attach, the file says why

The reduction is codl.analysis.pooled's, and the workflow's `pooled` rule makes it from a config
with a `blocks` section (tables/pooled_*.csv, figures/intervention.*): this script is retired
once its results are regenerated that way.

Order: repeat-major (a repeat is a block); inside a block the settings rotate by one per repeat
and each setting's pair runs ABBA (twin first on even blocks, second on odd ones), so a drift of
the machine over the allocation does not read as an effect of the factor.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from codl.analysis import chunked
from codl.analysis.pooled import (
    inflation,
    pool_runs,
    run_row,
    throughput_versus_torch,
    twin_id,
    with_knob_defaults,
)
from codl.config import build_plan, load_yaml
from codl.paths import RunFiles
from codl.spec import RunSpec, SharingStrategy
from codl.steps.analysis import compare_to, summarize_to


def setting(spec: RunSpec) -> tuple[str, ...]:
    """A loading run's row of the experiment: the knobs the intervention turns."""
    return (
        spec.pinning.policy.value,
        f"{spec.runtime.switch_interval_ms:g}",
        spec.loader.sharing_strategy.value,
        str(spec.loader.pin_memory).lower(),
        spec.pinning.pin_memory.value,
        spec.loader.handoff.value,
        str(spec.loader.workers),
        str(spec.loader.worker_nice),
    )


def interleaved(specs: Sequence[RunSpec]) -> list[RunSpec]:
    """Repeat-major (a repeat is a block); inside a block the loading settings rotate by one
    per repeat, each after its twin on even blocks and before it on odd ones (ABBA); a twin
    that several settings share runs once per block, where its first setting puts it."""
    by_id = {s.run_id: s for s in specs}
    out: list[RunSpec] = []
    for rep in sorted({s.repeat for s in specs}):
        mine = [s for s in specs if s.repeat == rep]
        loading = sorted((s for s in mine if s.mode.loads), key=setting)
        loading = loading[rep % len(loading) :] + loading[: rep % len(loading)] if loading else []
        done: set[str] = set()
        for spec in loading:
            pair = [by_id.get(twin_id(spec)) if twin_id(spec) else None, spec]
            for s in pair if rep % 2 == 0 else pair[::-1]:
                if s is not None and s.run_id not in done:
                    out.append(s)
                    done.add(s.run_id)
        out += [s for s in mine if s.run_id not in done]
    return out


def run_all(config: Path, work: Path, seconds: float) -> list[RunSpec]:
    from codl.datasets import generate
    from codl.harness.launch import launch

    deadline = time.time() + seconds
    specs = interleaved(list(build_plan(load_yaml(config)).specs.values()))
    done = []
    for i, spec in enumerate(specs):
        files = RunFiles(work / "runs" / spec.run_id)
        if files.trace.exists():
            done.append(spec)
            continue
        if time.time() > deadline:
            print(f"deadline reached before run {i + 1} of {len(specs)}", flush=True)
            break
        data = work / "data" / spec.dataset.name
        if spec.mode.loads and not data.exists():
            generate(spec.dataset, data)
        files.dir.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        launch(spec, trace_path=files.trace, dataset_dir=data if spec.mode.loads else None)
        done.append(spec)
        print(
            f"{i + 1}/{len(specs)} {spec.run_id} {spec.mode.value} {setting(spec)} "
            f"repeat {spec.repeat}: {time.time() - t0:.0f} s",
            flush=True,
        )
    return done


def gil_holders(raw: str) -> pd.DataFrame:
    """py-spy's raw ``--gil --threads`` stacks -> per thread and innermost Python frame (with the
    native leaf below it), the share of the samples in which it held the GIL."""
    rows = []
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        python = [f for f in frames[1:] if ".py:" in f]
        rows.append(
            {
                "thread": re.sub(r"\(\d+\)", "", frames[0]).replace("thread :", "").strip(),
                "python_frame": python[-1] if python else "(native only)",
                "native_leaf": frames[-1] if ".py:" not in frames[-1] else "",
                "samples": int(count),
            }
        )
    if not rows:
        return pd.DataFrame(columns=["thread", "python_frame", "native_leaf", "samples", "share"])
    t = pd.DataFrame(rows).groupby(["thread", "python_frame", "native_leaf"], as_index=False).sum()
    t["share"] = t["samples"] / t["samples"].sum()
    return t.sort_values("samples", ascending=False, ignore_index=True)


def record_stacks(config: Path, work: Path, out: Path, seconds: float) -> None:
    """The GIL's holders during a loading run at the default interval, sampled by py-spy."""
    import dataclasses
    import json
    import subprocess

    from codl.spec import StepsSpec

    # A run with launch threads to catch: a loading run that also computes (not `data` alone).
    loading = [
        s
        for s in build_plan(load_yaml(config)).specs.values()
        if s.mode.loads and s.mode.compute_twin is not None
    ]
    # The loading run with pinned memory (a pin-memory thread to catch) and the default sharing
    # strategy nearest CPython's own 5 ms (0 is CPython's own).
    base = min(
        loading,
        key=lambda s: (
            not s.loader.pin_memory,
            s.loader.sharing_strategy is not SharingStrategy.FILE_DESCRIPTOR,
            abs((s.runtime.switch_interval_ms or 5.0) - 5.0),
            s.repeat,
        ),
    )
    # Long enough to outlast the recording after the model is built (< 50 steps/s on an H200).
    spec = dataclasses.replace(base, steps=StepsSpec(warmup=10, measured=int(60 * seconds)))
    files = RunFiles(work / "stacks")
    files.dir.mkdir(parents=True, exist_ok=True)
    files.spec.write_text(json.dumps(spec.to_dict()))
    data = work / "data" / spec.dataset.name
    run = [sys.executable, "-m", "codl.cli", "run", str(files.spec), "--trace", str(files.trace)]
    proc = subprocess.Popen([*run, "--dataset-dir", str(data)])
    try:
        time.sleep(30)  # imports, the model on the GPU, the workers up, the warm-up steps
        pyspy = shutil.which("py-spy") or str(Path(sys.prefix) / "bin" / "py-spy")
        # Blocking (py-spy pauses the process per sample): this run measures nothing else.
        cmd = [pyspy, "record", "--gil", "--threads", "--native", "-r", "200"]
        cmd += ["-d", str(int(seconds)), "-f", "raw", "-o", str(out / "gil_stacks.txt")]
        if not Path(pyspy).exists():
            (out / "gil_stacks.txt").write_text(f"py-spy not found ({pyspy})\n")
            return
        got = subprocess.run(
            [*cmd, "--pid", str(proc.pid)], capture_output=True, text=True, check=False
        )
        if got.returncode != 0:
            (out / "gil_stacks.txt").write_text(f"py-spy failed ({got.returncode}):\n{got.stderr}")
            return
        holders = gil_holders((out / "gil_stacks.txt").read_text())
        holders.to_csv(out / "gil_holders.csv", index=False)
        print(holders.head(12).to_string(index=False), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def _run_row(spec: RunSpec, files: RunFiles) -> dict[str, object]:
    summary = summarize_to(files.trace, **{k: v for k, v in files.tables().items()})
    tables, attrs = chunked.read_summary_tables(files.trace)
    steps = pd.read_parquet(files.steps)
    return run_row(spec, summary=summary, steps=steps, tables=tables, attrs=attrs)


def reduce(config: Path, work: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(config, out / "config.yaml")
    specs = [
        s
        for s in build_plan(load_yaml(config)).specs.values()
        if RunFiles(work / "runs" / s.run_id).trace.exists()
    ]
    runs = pd.DataFrame([_run_row(s, RunFiles(work / "runs" / s.run_id)) for s in specs])
    runs.to_csv(out / "gil_runs.csv", index=False)
    files = [RunFiles(work / "runs" / s.run_id) for s in specs]
    compare_to(
        summaries=[f.summary for f in files],
        steps=[f.steps for f in files],
        attributions=[f.attribution for f in files],
        parts=[f.parts for f in files],
        runs_table=out / "runs.csv",
        steps_table=out / "steps.csv.gz",
        comparison_table=out / "comparison.csv",
        attribution_table=out / "attribution.csv.gz",
        decomposition_table=out / "decomposition.csv.gz",
    )
    table = inflation(runs)
    table.to_csv(out / "gil_inflation.csv", index=False)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def pool(tables: Sequence[Path], out: Path) -> pd.DataFrame:
    """``inflation`` over the runs of several calls (their run ids differ: a seed or a config
    of their own), each loading run against the twin of its own block."""
    try:
        runs = pool_runs([pd.read_csv(t) for t in tables])
    except ValueError as e:
        raise SystemExit(f"--pool {[str(t) for t in tables]}: {e}") from e
    table = inflation(runs)
    table.to_csv(out, index=False)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if "handoff" in runs and (runs["handoff"] == "ring").any():
        versus = throughput_versus_torch(runs)
        versus.to_csv(out.with_name(f"{out.stem}_throughput.csv"), index=False)
        print(versus.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    decompositions = [t.with_name("decomposition.csv.gz") for t in tables]
    if all(d.exists() for d in decompositions):
        draw(table, runs, decompositions, out.with_suffix(".png"))
    return table


def draw(
    table: pd.DataFrame, runs: pd.DataFrame, decompositions: Sequence[Path], png: Path
) -> None:
    from codl.figures.intervention import draw_intervention, host_blocked, inflation_points

    decomposition = pd.concat([pd.read_csv(d) for d in decompositions], ignore_index=True)
    runs = with_knob_defaults(runs)
    draw_intervention(inflation_points(table), host_blocked(decomposition, runs), [png])
    print(f"wrote {png}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--pool"] and len(argv) >= 3:
        pool([Path(a) for a in argv[2:]], Path(argv[1]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", type=Path)
    p.add_argument("work", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--seconds", type=float, default=420.0)
    p.add_argument("--reduce", action="store_true", help="only reduce what WORKDIR holds")
    p.add_argument("--stacks", type=float, default=0.0, help="py-spy's GIL holders, S seconds")
    args = p.parse_args(argv)
    if not args.reduce:
        run_all(args.config, args.work, args.seconds)
    reduce(args.config, args.work, args.out)
    if args.stacks > 0:
        record_stacks(args.config, args.work, args.out, args.stacks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
