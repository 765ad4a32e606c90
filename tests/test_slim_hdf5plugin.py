"""scripts/slim_hdf5plugin.py: the GPU node's hdf5plugin keeps the Blosc filter only, and the
wheel stays installable (RECORD matches what it holds)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "slim_hdf5plugin.py"
CONFIG = (
    "build_config = HDF5PluginBuildConfig(**{'sse2': True, 'filter_file_extension': '.so', "
    "'embedded_filters': ('blosc', 'blosc2', 'sz3', 'zfp')})\n"
)


def _load() -> object:
    spec = importlib.util.spec_from_file_location("slim_hdf5plugin", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _fake_wheel(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("hdf5plugin/__init__.py", "")
        z.writestr("hdf5plugin/_config.py", CONFIG)
        for lib in ("blosc", "blosc2", "sz3", "zfp"):
            z.writestr(f"hdf5plugin/plugins/libh5{lib}.so", lib.encode() * 100)
        z.writestr("hdf5plugin-7.1.0.dist-info/RECORD", "stale\n")


def test_only_the_kept_filters_remain_and_record_matches(tmp_path: Path) -> None:
    slim = _load()
    wheel = tmp_path / "hdf5plugin-7.1.0-py3-none-any.whl"
    _fake_wheel(wheel)
    out = slim.slim(wheel, tmp_path / "out", ("blosc",))  # type: ignore[attr-defined]
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        # blosc2's library shares blosc's prefix: only the exact name is kept.
        assert {n for n in names if "plugins/" in n} == {"hdf5plugin/plugins/libh5blosc.so"}
        assert "'embedded_filters': ('blosc',)" in z.read("hdf5plugin/_config.py").decode()
        record = z.read("hdf5plugin-7.1.0.dist-info/RECORD").decode().splitlines()
        for line in record:
            name, digest, size = line.split(",")
            if name.endswith("RECORD"):
                assert digest == size == ""
                continue
            data = z.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == "sha256=" + expected.decode() and int(size) == len(data)
        assert len(record) == len(names)


def test_a_missing_filter_or_a_wrong_wheel_is_refused(tmp_path: Path) -> None:
    slim = _load()
    wheel = tmp_path / "hdf5plugin-7.1.0-py3-none-any.whl"
    _fake_wheel(wheel)
    with pytest.raises(SystemExit, match=r"no filter library for \['lz4'\]"):
        slim.slim(wheel, tmp_path / "out", ("blosc", "lz4"))  # type: ignore[attr-defined]
    other = tmp_path / "numpy-2.0-py3-none-any.whl"
    other.write_bytes(wheel.read_bytes())
    with pytest.raises(SystemExit, match="expected an hdf5plugin wheel"):
        slim.slim(other, tmp_path / "out", ("blosc",))  # type: ignore[attr-defined]
