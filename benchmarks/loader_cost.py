"""Loader cost per sample of the three ``dataset.cost`` variants, on one core.

Builds a small ImageNet-like data set per cost (same images, same seed), then times the
worker's per-sample work in this process (fetch, decode, transform: the timestamps the loader
records for every item) over every sample, several passes. Prints a table and writes CSV.

    python benchmarks/loader_cost.py --samples 64 --passes 3
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from codl.datasets import generate
from codl.harness import data as hdata
from codl.spec import DatasetCost, DatasetSpec


def measure(root: Path, image_size: int, passes: int) -> pd.DataFrame:
    dataset = hdata.dataset_for("jpeg", root, image_size)
    rows = []
    for _ in range(passes):
        for i in range(len(dataset)):  # type: ignore[arg-type]
            _, _, row = dataset[i]
            t0, t1, t2, t3 = (int(v) for v in row[-4:])
            rows.append(
                {
                    "fetch_ms": (t1 - t0) / 1e6,
                    "decode_ms": (t2 - t1) / 1e6,
                    "transform_ms": (t3 - t2) / 1e6,
                    "item_ms": (t3 - t0) / 1e6,
                }
            )
    return pd.DataFrame(rows)


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
    table = []
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
            m = measure(root, args.image_size, args.passes)
            row = {"cost": cost.value, "items": len(m)}
            for col in m.columns:
                row[f"{col}_median"] = float(np.median(m[col]))
            row["items_per_s_per_core"] = 1000.0 / row["item_ms_median"]
            table.append(row)
    out = pd.DataFrame(table)
    print(out.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
