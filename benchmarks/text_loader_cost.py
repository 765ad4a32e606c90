"""The language-model loader's cost per sample: one text data set (documents + a BPE of
``--vocab`` tokens), sequences of each ``--seq-len``, in this process on one core.

Times the worker's per-sample work (fetch, decode = BPE encoding, transform = packing: the
timestamps the loader records for every item) and its CPU time, over ``--items`` samples after
one warm pass. Prints a table and writes CSV (``codl.measure``'s schema); also the data set's
generation time (corpus and BPE training).

    python benchmarks/text_loader_cost.py --documents 4000 --vocab 50257 --seq-len 128 1024
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from codl.datasets import generate
from codl.harness.text import PackedDocuments
from codl.measure import Recorder, table
from codl.spec import DatasetKind, DatasetSpec


def measure(rec: Recorder, root: Path, seq_len: int, vocab: int, items: int) -> None:
    """One round over ``items`` samples: each part's median item, and CPU time per item."""
    dataset = PackedDocuments(root, seq_len, vocab=vocab)
    n = min(items, len(dataset))
    for i in range(n):  # warm: page cache, the tokenizer's word cache
        dataset[i]
    rows = []
    rec.mark()
    cpu0 = time.process_time()
    for i in range(n):
        rows.append(dataset[i][2])
    cpu = (time.process_time() - cpu0) / n
    r = np.array(rows, dtype=np.int64)
    for part, lo in (("fetch", 5), ("decode", 6), ("transform", 7)):
        ms = float(np.median(r[:, lo + 1] - r[:, lo])) / 1e6
        rec.add(part, [ms], unit="ms", n=n, statistic="median item", seq_len=seq_len)
    rec.add("cpu", [cpu * 1e3], unit="ms", n=n, statistic="mean item (CPU)", seq_len=seq_len)
    rec.add(
        "tokens/cpu-s",
        [(seq_len + 1) / cpu],
        unit="1/s",
        n=n,
        statistic="mean item (CPU)",
        seq_len=seq_len,
    )


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
        rec = Recorder()
        rec.add("generate", [gen_s], unit="s", statistic="corpus + BPE training")
        for s in args.seq_len:
            measure(rec, root, s, max(args.vocab, stats["vocab"]), args.items)
    print(table(rec.measurements, column="seq_len"))
    rec.write(args.out)


if __name__ == "__main__":
    main()
