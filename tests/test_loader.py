"""The loader's process and sampling model: what a torchrun-started training would have."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import torch

from codl.datasets import generate
from codl.harness import data as hdata
from codl.spec import RunSpec
from codl.trace.store import open_trace


def _start_method_in_child(queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    ctx = hdata.worker_context()
    queue.put((multiprocessing.get_start_method(), ctx.get_start_method() if ctx else None))


def test_workers_fork_even_inside_a_spawned_rank() -> None:
    # Ranks are spawned; a spawned process defaults to spawn, which would start every loader
    # worker as a fresh interpreter, one after another.
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_start_method_in_child, args=(queue,))
    child.start()
    default, chosen = queue.get(timeout=60)
    child.join(timeout=60)
    assert default == "spawn"
    assert chosen == "fork"


def test_endless_shuffle_covers_every_index_once_per_pass_and_never_ends() -> None:
    size = 10
    sampler = hdata.EndlessShuffle(size, torch.Generator().manual_seed(0))
    drawn = list(itertools.islice(iter(sampler), size * 5))
    passes = [drawn[i * size : (i + 1) * size] for i in range(5)]
    assert all(sorted(p) == list(range(size)) for p in passes)
    # A new order each pass: a fixed order would make every epoch's batches identical.
    assert len({tuple(p) for p in passes}) > 1


def test_endless_shuffle_is_reproducible_from_its_generator() -> None:
    a = list(itertools.islice(iter(hdata.EndlessShuffle(7, torch.Generator().manual_seed(3))), 30))
    b = list(itertools.islice(iter(hdata.EndlessShuffle(7, torch.Generator().manual_seed(3))), 30))
    assert a == b


def test_a_corrupt_jpeg_fails_the_run_with_a_message_that_names_it(tmp_path: Path) -> None:
    spec = RunSpec.from_dict(
        {
            "mode": "data",
            "workload": {"batch_size": 4, "image_size": 32},
            "dataset": {"samples": 16, "height": 40, "width": 48},
            "loader": {"workers": 2},
            "steps": {"warmup": 1, "measured": 19},
        }
    )
    data = tmp_path / "jpeg"
    generate(spec.dataset, data)
    # 20 batches of 4 from 16 files: every file is read, the broken one among them.
    broken = sorted(data.rglob("*.jpg"))[5]
    broken.write_bytes(b"\xff\xd8 not a JPEG at all")
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_dict()))
    trace = tmp_path / "t.h5"
    cmd = [sys.executable, "-m", "codl.cli", "run", str(tmp_path / "spec.json")]
    cmd += ["--trace", str(trace), "--dataset-dir", str(data)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0
    assert f"{broken}: not a decodable JPEG" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    # What was measured before the bad sample is kept, marked incomplete with the same reason.
    assert not trace.exists()
    with open_trace(tmp_path / "t.incomplete.h5", allow_incomplete=True) as t:
        assert str(broken) in t.attrs["incomplete_reason"]
