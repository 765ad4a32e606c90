"""The language-model loader's cost per sample: one text data set (documents + a BPE of
``--vocab`` tokens), sequences of each ``--seq-len``, in this process on one core.

Times the worker's per-sample work (fetch, decode = BPE encoding, transform = packing: the
timestamps the loader records for every item) and its CPU time, over ``--items`` samples after
one warm pass. Prints a table and writes CSV; also the data set's generation time (corpus and
BPE training).

    python benchmarks/text_loader_cost.py --documents 4000 --vocab 50257 --seq-len 128 1024
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from codl.datasets import generate
from codl.harness.text import PackedDocuments
from codl.spec import DatasetKind, DatasetSpec


def measure(root: Path, seq_len: int, vocab: int, items: int) -> dict[str, float]:
    dataset = PackedDocuments(root, seq_len, vocab=vocab)
    n = min(items, len(dataset))
    for i in range(n):  # warm: page cache, the tokenizer's word cache
        dataset[i]
    rows = []
    cpu0 = time.process_time()
    for i in range(n):
        rows.append(dataset[i][2])
    cpu = (time.process_time() - cpu0) / n
    r = np.array(rows, dtype=np.int64)
    return {
        "seq_len": seq_len,
        "items": n,
        "fetch_ms_median": float(np.median(r[:, 6] - r[:, 5])) / 1e6,
        "decode_ms_median": float(np.median(r[:, 7] - r[:, 6])) / 1e6,
        "transform_ms_median": float(np.median(r[:, 8] - r[:, 7])) / 1e6,
        "cpu_ms_per_item": cpu * 1e3,
        "tokens_per_cpu_s": (seq_len + 1) / cpu,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--documents", type=int, default=4000)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seq-len", type=int, nargs="+", default=[128, 1024])
    p.add_argument("--items", type=int, default=300)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/text_loader_cost.csv"))
    args = p.parse_args()
    torch.set_num_threads(1)  # a loader worker's view: one thread
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "text"
        t0 = time.perf_counter()
        spec = DatasetSpec(name="text", kind=DatasetKind.TEXT, samples=args.documents)
        manifest = generate(DatasetSpec(**{**spec.__dict__, "classes": args.vocab}), root)
        gen_s = time.perf_counter() - t0
        stats = manifest["text"]
        print(
            f"data set: {args.documents} documents, {manifest['bytes'] / 1e6:.1f} MB, "
            f"{stats['tokens']} tokens, vocabulary {stats['vocab']}, "
            f"{stats['bytes_per_token']} bytes/token; generated in {gen_s:.1f} s "
            f"(load {os.getloadavg()[0]:.1f})"
        )
        table = [
            {**measure(root, s, max(args.vocab, stats["vocab"]), args.items), "generate_s": gen_s}
            for s in args.seq_len
        ]
    out = pd.DataFrame(table)
    print(out.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()
