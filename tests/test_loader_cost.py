"""Loader cost variants (``dataset.cost``): what each stores, how it is read, and its identity."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.io import decode_jpeg

from codl.config import build_plan
from codl.datasets import MANIFEST, check_dataset, generate
from codl.errors import CodlError, ConfigError, DataSetError
from codl.harness import data as hdata
from codl.spec import DatasetCost, DatasetSpec, RunSpec

SMALL = {"samples": 6, "classes": 2, "height": 24, "width": 32, "seed": 3}


def _set(tmp_path: Path, cost: str) -> tuple[DatasetSpec, Path]:
    spec = DatasetSpec(**{**SMALL, "name": cost, "cost": DatasetCost(cost)})
    out = tmp_path / cost
    generate(spec, out)
    return spec, out


def test_light_stores_the_jpeg_sets_images_pre_decoded(tmp_path: Path) -> None:
    _, light = _set(tmp_path, "light")
    _, jpeg = _set(tmp_path, "standard")
    arrays = sorted(light.rglob("*.npy"))
    jpegs = sorted(jpeg.rglob("*.jpg"))
    assert len(arrays) == len(jpegs) == SMALL["samples"]
    assert not list(light.rglob("*.jpg")) and not list(jpeg.rglob("*.npy"))
    assert json.loads((light / MANIFEST).read_text())["spec"]["cost"] == "light"
    for a, j in zip(arrays, jpegs, strict=True):
        assert a.relative_to(light).with_suffix("") == j.relative_to(jpeg).with_suffix("")
        pixels = np.load(a)
        decoded = decode_jpeg(torch.frombuffer(bytearray(j.read_bytes()), dtype=torch.uint8))
        assert pixels.dtype == np.uint8 and pixels.shape == tuple(decoded.shape)
        # The same image: only JPEG's loss (quality 90) between them.
        assert np.abs(pixels.astype(int) - decoded.numpy().astype(int)).mean() < 8


@pytest.mark.parametrize("cost", [c.value for c in DatasetCost])
def test_the_loader_follows_the_cost_its_data_set_was_built_for(tmp_path: Path, cost: str) -> None:
    _, root = _set(tmp_path, cost)
    dataset = hdata.dataset_for("jpeg", root, 16)
    assert isinstance(dataset, hdata.ImageFolderFiles)
    assert dataset.pre_decoded is (cost == "light")
    names = [type(t).__name__ for t in dataset.transform.transforms]
    assert ("RandomCrop" in names) is (cost == "light")
    assert ("RandomResizedCrop" in names) is (cost != "light")
    assert ("ColorJitter" in names and "GaussianBlur" in names) is (cost == "heavy")
    x, label, row = dataset[1]
    assert x.dtype == torch.float32 and tuple(x.shape) == (3, 16, 16)
    assert label in (0, 1)
    t0, t1, t2, t3 = row[-4:]
    assert t0 <= t1 <= t2 <= t3


def test_light_pads_images_smaller_than_the_crop(tmp_path: Path) -> None:
    _, root = _set(tmp_path, "light")
    x, _, _ = hdata.dataset_for("jpeg", root, 48)[0]  # images are ~24x32
    assert tuple(x.shape) == (3, 48, 48)


def test_a_corrupt_array_names_its_file(tmp_path: Path) -> None:
    _, root = _set(tmp_path, "light")
    dataset = hdata.dataset_for("jpeg", root, 16)
    broken = Path(dataset.samples[2][0])  # type: ignore[attr-defined]
    broken.write_bytes(b"not an array")
    with pytest.raises(DataSetError, match=f"{broken}: not a readable .npy array"):
        dataset[2]
    np.save(broken, np.zeros((4, 8, 8), dtype=np.uint8))
    with pytest.raises(DataSetError, match=r"expected uint8 \[3, H, W\]"):
        dataset[2]


def test_a_set_built_before_costs_existed_is_standard(tmp_path: Path) -> None:
    spec, root = _set(tmp_path, "standard")
    manifest = json.loads((root / MANIFEST).read_text())
    del manifest["spec"]["cost"]
    (root / MANIFEST).write_text(json.dumps(manifest))
    assert check_dataset(spec, root)["spec"].get("cost") is None
    assert hdata.dataset_cost(root) is DatasetCost.STANDARD
    light = DatasetSpec(**{**SMALL, "name": "standard", "cost": DatasetCost.LIGHT})
    with pytest.raises(CodlError, match="cost: data set has 'standard', spec wants 'light'"):
        check_dataset(light, root)


def test_cost_is_in_the_id_only_when_away_from_its_default() -> None:
    base = RunSpec()
    assert '"cost"' not in base.canonical_json()  # ids of runs measured before costs hold
    ids = {RunSpec.from_dict({"dataset": {"cost": c.value}}).run_id for c in DatasetCost}
    assert len(ids) == 3 and base.run_id in ids
    compute = {
        RunSpec.from_dict({"mode": "compute", "dataset": {"cost": c.value}}).run_id
        for c in DatasetCost
    }
    assert len(compute) == 1  # a run that does not load shares its isolation twin


def test_cost_variants_are_of_jpeg_sets_only() -> None:
    with pytest.raises(
        ConfigError, match=r"dataset\.cost: got 'light' with dataset\.kind 'volume'"
    ):
        RunSpec.from_dict(
            {"workload": {"model": "cosmoflow"}, "dataset": {"kind": "volume", "cost": "light"}}
        )


def test_one_data_set_name_cannot_hold_two_costs() -> None:
    experiments = [
        {"name": cost, "base": {"dataset": {"name": "same", "cost": cost}}}
        for cost in ("light", "heavy")
    ]
    with pytest.raises(ConfigError, match=r"dataset\.name 'same' is defined with.*cost"):
        build_plan({"defaults": {"dataset": {"samples": 32}}, "experiments": experiments})
