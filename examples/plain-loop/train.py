"""A plain training loop (no CoDL harness) whose loader is torch's DataLoader or codl's, by one
flag. The data set is synthetic but costs what a real one costs per sample: JPEGs made once at
start, then per sample a JPEG decode and the ImageNet training augmentation.

    python examples/plain-loop/train.py --loader codl --workers 12 --model resnet50 --device cuda
    python examples/plain-loop/train.py --loader torch --workers 2 --model tiny --device cpu \
        --steps 5 --batch-size 8 --image-size 32

Prints throughput (samples/s over the measured steps), the mean step compute time (CUDA events
on a GPU) and the mean wait for a batch; ``--json`` prints the same as one JSON line.
``--compute-only`` trains on one batch made before the loop (no loader): the compute time
against which loading's inflation of compute is measured (benchmarks/plain_loop.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from typing import Any

import torch
import torch.utils.data as tud
from torch import nn


class SyntheticJpegs(tud.Dataset[tuple[torch.Tensor, int]]):
    """``distinct`` random JPEGs, read ``length`` times in all: sample i decodes JPEG
    i mod distinct, then crops, resizes, flips and normalises it at random (per sample CPU
    work as on ImageNet). Long enough for every step of a run to be one epoch."""

    def __init__(self, *, distinct: int, length: int, image_size: int, classes: int) -> None:
        from torchvision.io import encode_jpeg
        from torchvision.transforms import v2

        gen = torch.Generator().manual_seed(1234)
        side = max(image_size + image_size // 7, 16)  # a little larger: the crop has room
        self.jpegs = [
            encode_jpeg(torch.randint(0, 256, (3, side, side), dtype=torch.uint8, generator=gen))
            .numpy()
            .tobytes()
            for _ in range(distinct)
        ]
        self.length, self.classes = length, classes
        self.transform = v2.Compose(
            [
                v2.RandomResizedCrop(image_size, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
            ]
        )

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from torchvision.io import decode_jpeg

        raw = self.jpegs[i % len(self.jpegs)]
        img = decode_jpeg(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        return self.transform(img), i % self.classes


def tiny_model(classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, classes),
    )


def build_model(name: str, classes: int) -> nn.Module:
    if name == "tiny":
        return tiny_model(classes)
    from torchvision.models import resnet50

    model: nn.Module = resnet50(num_classes=classes)
    return model


def build_loader(args: argparse.Namespace, dataset: tud.Dataset[Any], device: torch.device) -> Any:
    """The one line that differs: torch's DataLoader, or codl's with the copy to the device
    done one batch ahead on the loader's stream."""
    common: dict[str, Any] = dict(
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=args.pin_memory and device.type == "cuda",
        drop_last=True,
        generator=torch.Generator().manual_seed(args.seed),
        persistent_workers=args.workers > 0,
    )
    if args.workers > 0:
        common["prefetch_factor"] = args.prefetch_factor
    if args.loader == "codl":
        from codl.loader import DataLoader

        return DataLoader(dataset, device=device, **common)
    return tud.DataLoader(dataset, **common)


class StepTimer:
    """Compute time per step: CUDA events on a GPU (read after the run, no synchronisation
    per step), the wall clock on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.pairs: list[Any] = []

    def start(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            ev.record()
            return ev
        return time.perf_counter()

    def stop(self, begun: Any) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            ev.record()
            self.pairs.append((begun, ev))
        else:
            self.pairs.append((begun, time.perf_counter()))

    def mean_ms(self) -> float:
        if not self.pairs:
            return float("nan")
        if self.cuda:
            torch.cuda.synchronize()
            ms = [a.elapsed_time(b) for a, b in self.pairs]
        else:
            ms = [(b - a) * 1e3 for a, b in self.pairs]
        return float(sum(ms) / len(ms))


def train(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    classes = 10 if args.model == "tiny" else 1000
    model = build_model(args.model, classes).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp)
    total = args.warmup + args.steps
    timer = StepTimer(device)

    if args.compute_only:
        x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
        y = torch.randint(0, classes, (args.batch_size,), device=device)
        batches: Any = iter([(x, y)] * total)
        loader = None
    else:
        dataset = SyntheticJpegs(
            distinct=args.samples,
            length=max(args.samples, args.batch_size * total),
            image_size=args.image_size,
            classes=classes,
        )
        loader = build_loader(args, dataset, device)
        batches = iter(loader)

    digest = hashlib.sha256()
    wait_s = 0.0
    start = time.perf_counter()
    for step in range(total):
        if step == args.warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start, wait_s, timer.pairs = time.perf_counter(), 0.0, []
        t0 = time.perf_counter()
        x, y = next(batches)
        # torch's loader gives CPU (pinned) batches; codl's are already on the device.
        x = x.to(device, non_blocking=True).to(memory_format=torch.channels_last)
        y = y.to(device, non_blocking=True)
        wait_s += time.perf_counter() - t0
        if not args.compute_only and step < args.warmup:
            # Read back during warm-up only: a copy to the host is a synchronisation.
            digest.update(y.cpu().numpy().tobytes())
        begun = timer.start()
        with amp:
            loss = loss_fn(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        timer.stop(begun)
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    if loader is not None and hasattr(loader, "close"):
        loader.close()
    return {
        "loader": "none" if args.compute_only else args.loader,
        "workers": 0 if args.compute_only else args.workers,
        "model": args.model,
        "device": device.type,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "samples_per_s": args.batch_size * args.steps / wall,
        "step_compute_ms": timer.mean_ms(),
        "data_wait_ms": wait_s / args.steps * 1e3,
        "wall_s": wall,
        # The labels of the warm-up steps: equal for both loaders with one seed.
        "batches_digest": digest.hexdigest()[:16],
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loader", choices=["torch", "codl"], default="torch")
    p.add_argument("--workers", type=int, default=4, help="loader worker processes (default 4)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=100, help="measured steps (default 100)")
    p.add_argument("--warmup", type=int, default=10, help="steps before measuring (default 10)")
    p.add_argument("--model", choices=["resnet50", "tiny"], default="resnet50")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--samples", type=int, default=256, help="distinct JPEGs made at start")
    p.add_argument("--prefetch-factor", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--pin-memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="page-locked batches (CUDA only; default on)",
    )
    p.add_argument(
        "--amp",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bf16 autocast (default: on with CUDA)",
    )
    p.add_argument("--compute-only", action="store_true", help="one pre-made batch, no loader")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = p.parse_args(argv)
    for name in ("workers", "batch_size", "steps", "image_size", "samples", "prefetch_factor"):
        low = 0 if name == "workers" else 1
        if getattr(args, name) < low:
            p.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device (use --device cpu)")
    if args.amp is None:
        args.amp = args.device == "cuda"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = train(args)
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print(
            f"{result['loader']:>5} loader, {result['workers']} workers, {args.model} on "
            f"{args.device}: {result['samples_per_s']:.1f} samples/s over {args.steps} steps; "
            f"compute {result['step_compute_ms']:.2f} ms/step, waiting for data "
            f"{result['data_wait_ms']:.2f} ms/step (means)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
