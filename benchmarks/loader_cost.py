"""Loader cost per sample of the three ``dataset.cost`` variants, on one core.

Builds a small ImageNet-like data set per cost (same images, same seed), then times the
worker's per-sample work in this process (fetch, decode, transform: the timestamps the loader
records for every item) over every sample, several passes. Each pass is a round: its value is
the median over the pass's samples. Prints a table and writes CSV (``codl.measure``'s schema).

    python benchmarks/loader_cost.py --samples 64 --passes 3
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd
import torch

from codl.datasets import generate
from codl.harness import data as hdata
from codl.measure import Recorder, table
from codl.spec import DatasetCost, DatasetSpec


def measure(root: Path, image_size: int, passes: int) -> pd.DataFrame:
    dataset = hdata.dataset_for("jpeg", root, image_size)
    rows = []
    for pass_ in range(passes):
        for i in range(len(dataset)):  # type: ignore[arg-type]
            _, _, row = dataset[i]
            t0, t1, t2, t3 = (int(v) for v in row[-4:])
            rows.append(
                {
                    "pass": pass_,
                    "fetch_ms": (t1 - t0) / 1e6,
                    "decode_ms": (t2 - t1) / 1e6,
                    "transform_ms": (t3 - t2) / 1e6,
                    "item_ms": (t3 - t0) / 1e6,
                }
            )
    return pd.DataFrame(rows)


def record(rec: Recorder, cost: str, m: pd.DataFrame) -> None:
    """One measurement per part; a round is one pass, its value the pass's median item."""
    passes = m.groupby("pass")
    n = passes.size().tolist()
    for col in ("fetch_ms", "decode_ms", "transform_ms", "item_ms"):
        rec.add(
            col.removesuffix("_ms"),
            passes[col].median(),
            unit="ms",
            n=n,
            statistic="median item",
            cost=cost,
        )
    # Items a core does per second: the reciprocal of each pass's median item.
    per_s = 1000.0 / passes["item_ms"].median()
    rec.add("items/s/core", per_s, unit="1/s", n=n, statistic="1/median item", cost=cost)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--height", type=int, default=375)
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/loader_cost.csv"))
    args = p.parse_args()
    torch.set_num_threads(1)  # a loader worker's view: one thread
    rec = Recorder()
    with tempfile.TemporaryDirectory() as tmp:
        for cost in DatasetCost:
            spec = DatasetSpec(
                name=cost.value,
                samples=args.samples,
                height=args.height,
                width=args.width,
                cost=cost,
            )
            root = Path(tmp) / cost.value
            generate(spec, root)
            rec.mark()
            record(rec, cost.value, measure(root, args.image_size, args.passes))
    print(table(rec.measurements, column="cost", baseline=DatasetCost.LIGHT.value))
    rec.write(args.out)


if __name__ == "__main__":
    main()
