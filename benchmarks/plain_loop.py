"""examples/plain-loop/train.py with torch's DataLoader against codl's, as a user would run it.

Each run is its own process (the run is the sample). Blocks are interleaved: in each block, one
compute-only run (a pre-made batch, no loader: the compute time loading is compared with), then
for every worker count a torch run and a codl run, in ABBA order across worker counts and
blocks, so that drift of the machine falls on both loaders alike. Reported per setting, over
blocks (n = blocks):

- throughput, samples/s: geometric mean and 95 % t interval (on the logs);
- codl/torch: the ratio of the two runs of the same block and worker count, geometric mean and
  95 % t interval: above 1 codl is faster;
- compute inflation: the run's mean step compute time (CUDA events) over the same block's
  compute-only run's, minus 1, geometric mean over blocks.

Writes ``<out>/plain_loop.md`` (the table, the exact command in its header) and
``<out>/plain_loop.csv`` (one row per run).

    python benchmarks/plain_loop.py --device cuda --model resnet50 --workers 12 24 --blocks 3 \
        --out benchmarks/results/plain-loop
    python benchmarks/plain_loop.py --device cpu --model tiny --workers 1 --blocks 1 \
        --steps 2 --batch-size 4 --image-size 32 --out /tmp/plain-loop
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TRAIN = Path(__file__).resolve().parent.parent / "examples" / "plain-loop" / "train.py"
LOADERS = ("torch", "codl")
# A 95 % interval whose half-width passes this share of its centre is flagged, not hidden.
UNSTABLE = 0.05


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(0.975, df))


def geo_interval(values: list[float]) -> tuple[float, float, float]:
    """Geometric mean and 95 % t interval on the logs; the interval is NaN for n < 2."""
    logs = [math.log(v) for v in values]
    centre = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(centre), math.nan, math.nan
    half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(centre), math.exp(centre - half), math.exp(centre + half)


def schedule(blocks: int, workers: list[int], compute: bool = True) -> list[tuple[int, str, int]]:
    """(block, loader, workers) in run order; loader 'none' is the block's compute-only run."""
    runs: list[tuple[int, str, int]] = []
    for b in range(blocks):
        runs += [(b, "none", 0)] if compute else []
        for i, w in enumerate(workers):
            order = LOADERS if (b + i) % 2 == 0 else LOADERS[::-1]
            runs += [(b, loader, w) for loader in order]
    return runs


def run_one(args: argparse.Namespace, loader: str, workers: int) -> dict[str, Any]:
    cmd = [args.python, str(TRAIN), "--json", "--model", args.model, "--device", args.device]
    cmd += ["--batch-size", str(args.batch_size), "--steps", str(args.steps)]
    cmd += ["--warmup", str(args.warmup), "--image-size", str(args.image_size)]
    cmd += ["--samples", str(args.samples), "--seed", str(args.seed)]
    cmd += (
        ["--compute-only"] if loader == "none" else ["--loader", loader, "--workers", str(workers)]
    )
    proc = subprocess.run(
        cmd, capture_output=True, text=True, check=False, timeout=args.run_timeout
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"{shlex.join(cmd)} failed with status {proc.returncode}: {tail[0]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for block, loader, workers in schedule(args.blocks, args.workers, args.compute_runs):
        started = time.monotonic()
        result = run_one(args, loader, workers)
        result |= {"block": block, "run_s": time.monotonic() - started}
        rows.append(result)
        print(
            f"block {block} {loader:>5} {workers:>3} workers: {result['samples_per_s']:9.1f} "
            f"samples/s, compute {result['step_compute_ms']:.2f} ms/step",
            file=sys.stderr,
            flush=True,
        )
    return rows


def summarize(rows: list[dict[str, Any]], workers: list[int]) -> list[dict[str, Any]]:
    compute = {r["block"]: r["step_compute_ms"] for r in rows if r["loader"] == "none"}
    of = {(r["block"], r["loader"], r["workers"]): r for r in rows if r["loader"] != "none"}
    blocks = sorted({r["block"] for r in rows})
    out = []
    for w in workers:
        for loader in LOADERS:
            runs = [of[(b, loader, w)] for b in blocks]
            tput = geo_interval([r["samples_per_s"] for r in runs])
            inflation = [r["step_compute_ms"] / compute.get(r["block"], math.nan) for r in runs]
            ok = all(math.isfinite(v) and v > 0 for v in inflation)
            ratio = (math.nan,) * 3
            if loader == "codl":
                ratio = geo_interval(
                    [
                        of[(b, "codl", w)]["samples_per_s"] / of[(b, "torch", w)]["samples_per_s"]
                        for b in blocks
                    ]
                )
            out.append(
                {
                    "workers": w,
                    "loader": loader,
                    "n": len(runs),
                    "samples_per_s": tput,
                    "ratio": ratio,
                    "inflation": geo_interval(inflation)[0] - 1 if ok else math.nan,
                    "same_batches": len(
                        {
                            r["batches_digest"]
                            for r in rows
                            if r["workers"] == w and r["block"] in blocks and r["loader"] != "none"
                        }
                    )
                    == 1,
                }
            )
    return out


def _ci(c: tuple[float, float, float], fmt: str) -> str:
    centre, lo, hi = c
    if math.isnan(centre):
        return ""
    text = format(centre, fmt)
    if math.isnan(lo):
        return text + " (n=1: no interval)"
    text += f" [{format(lo, fmt)}, {format(hi, fmt)}]"
    if (hi - lo) / 2 > UNSTABLE * centre:
        text += " unstable"
    return text


def table(summary: list[dict[str, Any]], command: str, args: argparse.Namespace) -> str:
    lines = [
        "# Plain training loop: torch's DataLoader against codl.loader",
        "",
        f"Command: `{command}`",
        "",
        f"{args.model} on {args.device}, batch {args.batch_size}, {args.steps} measured steps "
        f"after {args.warmup} per run, images {args.image_size} px; n = {args.blocks} blocks "
        "(one process per run, ABBA order). Intervals are 95 % t intervals over blocks, on logs; "
        f"'unstable' marks a half-width above {UNSTABLE:.0%} of the value.",
        "",
        "| workers | loader | samples/s, geomean [95 % CI] | codl/torch, same block [95 % CI] "
        "| compute inflation (geomean) | same batches |",
        "|---:|---|---|---|---:|---|",
    ]
    for s in summary:
        infl = "" if math.isnan(s["inflation"]) else f"{s['inflation']:+.1%}"
        lines.append(
            f"| {s['workers']} | {s['loader']} | {_ci(s['samples_per_s'], '.1f')} "
            f"| {_ci(s['ratio'], '.3f')} | {infl} | {'yes' if s['same_batches'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def write(
    rows: list[dict[str, Any]],
    summary: list[dict[str, Any]],
    out: Path,
    command: str,
    args: argparse.Namespace,
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    fields = ["block", "loader", "workers", "model", "device", "batch_size", "steps"]
    fields += [
        "samples_per_s",
        "step_compute_ms",
        "data_wait_ms",
        "wall_s",
        "run_s",
        "batches_digest",
    ]
    with open(out / "plain_loop.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    md = out / "plain_loop.md"
    md.write_text(table(summary, command, args))
    return md


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--workers", type=int, nargs="+", default=[12, 24])
    p.add_argument("--model", choices=["resnet50", "tiny"], default="resnet50")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--samples", type=int, default=256, help="distinct JPEGs per run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--compute-runs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a compute-only run per block, for compute inflation (default on)",
    )
    p.add_argument("--run-timeout", type=float, default=300, help="seconds per run before it fails")
    p.add_argument("--python", default=sys.executable, help="the interpreter that runs the example")
    p.add_argument("--out", type=Path, required=True, help="directory for plain_loop.md and .csv")
    args = p.parse_args(argv)
    if args.blocks < 1:
        p.error(f"--blocks must be >= 1, got {args.blocks}")
    if any(w < 1 for w in args.workers):
        p.error(f"--workers must all be >= 1 (codl's ring needs workers), got {args.workers}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    command = shlex.join(
        ["python", "benchmarks/plain_loop.py", *(sys.argv[1:] if argv is None else argv)]
    )
    rows = measure(args)
    summary = summarize(rows, args.workers)
    md = write(rows, summary, args.out, command, args)
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
