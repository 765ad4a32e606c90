"""The loader's process and sampling model: what a torchrun-started training would have."""

from __future__ import annotations

import itertools
import multiprocessing

import torch

from codl.harness import data as hdata


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
