"""Synthetic input data sets, generated deterministically from a DatasetSpec.

JPEG: an ImageFolder (``class_NNN/img_NNNNNN.jpg``) of smooth random images with per-image size
jitter, so that decode cost and file sizes resemble natural photos rather than incompressible
noise (noise JPEGs are ~3x larger and slower to decode than ImageNet's at the same resolution).
Volume: HDF5 sample files of float32 4-channel cubes, CosmoFlow-like.
A MANIFEST.json written last records the spec, file count and bytes; its presence marks a
complete data set.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from codl.spec import DatasetKind, DatasetSpec, _to_jsonable

MANIFEST = "MANIFEST.json"
VOLUME_CHANNELS = 4


def generate(spec: DatasetSpec, out_dir: Path) -> dict[str, Any]:
    """Build the data set in a sibling temporary directory, then move it into place."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    rng = np.random.default_rng(spec.seed)
    if spec.kind is DatasetKind.JPEG:
        files, nbytes = _generate_jpeg(spec, tmp, rng)
    else:
        files, nbytes = _generate_volumes(spec, tmp, rng)
    manifest = {
        "spec": _to_jsonable(spec),
        "files": files,
        "bytes": nbytes,
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return manifest


def _generate_jpeg(spec: DatasetSpec, root: Path, rng: np.random.Generator) -> tuple[int, int]:
    from PIL import Image

    nbytes = 0
    for i in range(spec.samples):
        label = i % spec.classes
        h = max(8, int(spec.height * rng.uniform(0.8, 1.2)))
        w = max(8, int(spec.width * rng.uniform(0.8, 1.2)))
        # Low-frequency colour field plus mild noise: compresses like a photo.
        coarse = rng.integers(0, 256, size=(max(2, h // 16), max(2, w // 16), 3), dtype=np.uint8)
        img = Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC)
        arr = np.asarray(img, dtype=np.int16) + rng.integers(-12, 13, size=(h, w, 3))
        img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
        d = root / f"class_{label:03d}"
        d.mkdir(exist_ok=True)
        path = d / f"img_{i:06d}.jpg"
        img.save(path, format="JPEG", quality=spec.quality)
        nbytes += path.stat().st_size
    return spec.samples, nbytes


def _generate_volumes(spec: DatasetSpec, root: Path, rng: np.random.Generator) -> tuple[int, int]:
    import h5py

    nbytes = 0
    shape = (VOLUME_CHANNELS, spec.depth, spec.height, spec.width)
    for i in range(spec.samples):
        path = root / f"sample_{i:06d}.h5"
        vol = rng.standard_normal(shape, dtype=np.float32)
        target = rng.standard_normal(VOLUME_CHANNELS, dtype=np.float32)
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=vol)
            f.create_dataset("y", data=target)
            f.attrs["label"] = i % spec.classes
        nbytes += path.stat().st_size
    return spec.samples, nbytes


def read_manifest(out_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(out_dir) / MANIFEST).read_text())
    return data


def stage(source: Path, target: Path, *, marker: Path) -> dict[str, Any]:
    """Copy a complete data set to a storage tier (temporary name, then rename), then mark it."""
    manifest = read_manifest(source)
    target = Path(target)
    tmp = target.with_name(target.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, tmp)
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"source": str(source), "target": str(target), **manifest}))
    return manifest
