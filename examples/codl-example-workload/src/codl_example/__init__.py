"""An example CoDL workload: 1-D signals classified from their spectra.

Everything codl needs is on :class:`SignalWorkload` (the protocol of ``codl.harness.workloads``):
the data set it generates (``generate_dataset``, data sets of kind ``workload``), how one sample
is read with its timing row (``open_dataset``), the batch of the modes that do not load, the
model and the loss. Collate, DDP options and plan checks are left to codl's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from codl.harness.data import timing_row
from codl.spec import DatasetSpec, WorkloadSpec
from codl.trace.clock import now_ns

SIGNAL_LENGTH = 1024
# Features: the magnitudes of the lowest rfft bins.
FEATURES = 128


class Signals(torch.utils.data.Dataset):
    """``signal_NNNNNN.npy`` files: fetch = read, decode = parse the array, transform = FFT."""

    def __init__(self, root: Path) -> None:
        self.files = sorted(str(p) for p in Path(root).glob("signal_*.npy"))
        if not self.files:
            raise FileNotFoundError(f"no signal_*.npy files under {root}")
        self.labels = np.load(Path(root) / "labels.npy")

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, np.ndarray]:
        t0 = now_ns()
        with open(self.files[index], "rb") as f:
            raw = f.read()
        t1 = now_ns()
        signal = np.frombuffer(raw[-SIGNAL_LENGTH * 4 :], dtype=np.float32)
        t2 = now_ns()
        spectrum = np.abs(np.fft.rfft(signal))[:FEATURES]
        x = torch.from_numpy(np.log1p(spectrum).astype(np.float32))
        t3 = now_ns()
        return x, int(self.labels[index]), timing_row(index, t0, t1, t2, t3)


@dataclass(frozen=True)
class SignalWorkload:
    name: str = "example-signals"
    description: str = "1-D signals -> FFT features -> MLP (codl-example-workload)"
    dataset_kind: str = "workload"

    def generate_dataset(self, spec: DatasetSpec, out: Path) -> int:
        # Class c is a sine at frequency 4 (c + 1) cycles per signal, plus noise.
        rng = np.random.default_rng(spec.seed)
        labels = np.arange(spec.samples) % spec.classes
        t = np.arange(SIGNAL_LENGTH) / SIGNAL_LENGTH
        for i, c in enumerate(labels):
            wave = np.sin(2 * np.pi * 4 * (c + 1) * t + rng.uniform(0, 2 * np.pi))
            noisy = wave + rng.normal(0, 0.5, SIGNAL_LENGTH)
            np.save(out / f"signal_{i:06d}.npy", noisy.astype(np.float32))
        np.save(out / "labels.npy", labels)
        return spec.samples

    def open_dataset(self, root: Path, spec: WorkloadSpec) -> Signals:
        return Signals(root)

    def build_model(self, spec: WorkloadSpec) -> nn.Module:
        return nn.Sequential(
            nn.Linear(FEATURES, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, spec.classes),
        )

    def synthetic_batch(self, spec: WorkloadSpec, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(spec.batch_size, FEATURES, device=device)
        return x, torch.randint(0, spec.classes, (spec.batch_size,), device=device)

    def loss(self, spec: WorkloadSpec) -> Any:
        return nn.CrossEntropyLoss()
