"""Traces that stock HDF5 tools open: the codec named in root attributes, `codl inspect` saying
how to read the data without codl, and `codl convert` writing a gzip copy that plain h5py (no
hdf5plugin) and h5dump read."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from codl.cli import main
from codl.trace.store import open_trace
from codl.trace.store.convert import convert_trace

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "traces" / "r2_combined.h5.gz"

# A child Python that has never imported hdf5plugin and has no plugin path: what a user of
# plain h5py (or xarray on h5py/h5netcdf) gets.
_PLAIN_READ = """
import json, sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    g = f["events/app"]
    n = int(g.attrs["rows"])
    print(json.dumps({"start_ns": g["start_ns"][:n].tolist(), "step": g["step"][:n].tolist(),
                      "compression": str(f.attrs.get("compression")),
                      "filter": int(f.attrs.get("hdf5_filter_id", -1))}))
"""


_NO_PLUGINS = Path(__file__).resolve().parent / "data" / "h200-30step"


def _plain_env() -> dict[str, str]:
    # A plugin path that holds no HDF5 filter (a data directory of the tests), so that neither
    # the caller's HDF5_PLUGIN_PATH nor a filter installed in HDF5's default one is found.
    return {**os.environ, "HDF5_PLUGIN_PATH": str(_NO_PLUGINS)}


def _plain_read(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _PLAIN_READ, str(path)],
        capture_output=True,
        text=True,
        env=_plain_env(),
        check=False,
    )


@pytest.fixture
def blosc_trace(tmp_path: Path) -> Path:
    """A real two-rank trace (the golden one, gzip) copied to the default codec, Blosc."""
    gz = tmp_path / "golden.h5"
    with gzip.open(GOLDEN, "rb") as src:
        gz.write_bytes(src.read())
    out = convert_trace(gz, tmp_path / "blosc.h5", compression="blosc-lz4")
    with h5py.File(out, "r") as f:
        assert f.attrs["compression"] == "blosc-lz4"
        assert f.attrs["hdf5_filter_id"] == 32001
        assert "32001" in f["events/app/start_ns"]._filters
    return out


def test_a_written_trace_names_its_codec_and_filter(tmp_path: Path) -> None:
    from test_export import write_trace

    for codec, filter_id in (("blosc-lz4", 32001), ("gzip", 1)):
        from codl.trace.store import TraceWriter

        path = tmp_path / f"{codec}.h5"
        with TraceWriter(path, compression=codec) as w:
            w.append("threads", {"t_ns": [1], "rank": [0], "pid": [1], "tid": [1],
                                 "role": ["launch"], "name": ["x"], "cpus_planned": [""],
                                 "cpus_actual": ["0"]})  # fmt: skip
            w.finish()
        with h5py.File(path, "r") as f:
            assert (f.attrs["compression"], f.attrs["hdf5_filter_id"]) == (codec, filter_id)
        with open_trace(path) as t:  # the attributes are inside the metadata digest
            assert t.codec == codec
    # The default is what the benchmark chose (docs/trace-format.md, "Compression").
    default = write_trace(tmp_path / "default.h5")
    with open_trace(default) as t:
        assert t.codec == "blosc-lz4"


def test_plain_h5py_reads_a_converted_trace_and_not_the_blosc_one(
    blosc_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plain.h5"
    assert main(["convert", str(blosc_trace), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    refused = _plain_read(blosc_trace)
    # Metadata opens, data does not: HDF5 finds no plugin for filter 32001.
    assert refused.returncode != 0
    assert "Can't synchronously read data" in refused.stderr, refused.stderr
    plain = _plain_read(out)
    assert plain.returncode == 0, plain.stderr
    got = json.loads(plain.stdout)
    assert (got["compression"], got["filter"]) == ("gzip", 1)
    with open_trace(blosc_trace) as t:
        app = t.table("events/app")
    assert got["start_ns"] == app["start_ns"].tolist()
    assert got["step"] == app["step"].tolist()
    assert len(got["start_ns"]) > 0


def test_the_copy_is_the_same_trace(blosc_trace: Path, tmp_path: Path) -> None:
    out = convert_trace(blosc_trace, tmp_path / "copy.h5")
    with open_trace(blosc_trace) as a, open_trace(out) as b:
        b.verify()
        assert b.codec == "gzip"
        differ = {k for k in a.attrs.keys() | b.attrs.keys() if a.attrs.get(k) != b.attrs.get(k)}
        assert differ - {"attrs_sha256"} == {"compression", "hdf5_filter_id"}
        assert a.tables() == b.tables()
        for name in a.tables():
            x, y = a.table(name), b.table(name)
            assert x.equals(y), name
    with h5py.File(out, "r") as f:
        # Every column stored gzip + shuffle + fletcher32, in the source's chunk shape.
        for table in ("events/app", "events/loader", "samples/sched"):
            for ds in f[table].values():
                assert ds.compression == "gzip" and ds.shuffle and ds.fletcher32
                assert ds.chunks is not None


@pytest.mark.skipif(shutil.which("h5dump") is None, reason="h5dump not installed (hdf5-tools)")
def test_h5dump_reads_the_converted_events(blosc_trace: Path, tmp_path: Path) -> None:
    out = convert_trace(blosc_trace, tmp_path / "copy.h5")

    def dump(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["h5dump", "-d", "/events/app/start_ns", "-y", "-w", "0", str(path)],
            capture_output=True,
            text=True,
            env=_plain_env(),
            check=False,
        )

    assert dump(blosc_trace).returncode != 0  # no Blosc plugin for h5dump either
    done = dump(out)
    assert done.returncode == 0, done.stderr
    body = done.stdout.split("DATA {", 1)[1].split("}", 1)[0]
    values = [int(v) for v in body.replace(",", " ").split()]
    with open_trace(blosc_trace) as t:
        assert values == t.table("events/app")["start_ns"].tolist()


def test_inspect_says_how_to_read_without_codl(
    blosc_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import hdf5plugin

    assert main(["inspect", str(blosc_trace)]) == 0
    text = capsys.readouterr().out
    codec = next(line for line in text.splitlines() if line.startswith("codec"))
    assert "blosc-lz4" in codec and "32001" in codec
    assert "import hdf5plugin" in codec
    assert f"HDF5_PLUGIN_PATH={hdf5plugin.PLUGIN_PATH}" in codec
    assert "codl convert" in codec
    assert main(["inspect", "--json", str(blosc_trace)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["compression"], info["hdf5_filter_id"]) == ("blosc-lz4", 32001)
    # The hint's plugin path works: plain h5py reads the Blosc trace with it.
    env = {**_plain_env(), "HDF5_PLUGIN_PATH": hdf5plugin.PLUGIN_PATH}
    done = subprocess.run(
        [sys.executable, "-c", _PLAIN_READ, str(blosc_trace)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_convert_refuses_bad_outputs_and_writes_nothing(
    blosc_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.h5"
    convert_trace(blosc_trace, other)
    before = other.read_bytes()
    link = tmp_path / "link.h5"
    link.symlink_to(blosc_trace)
    cases = [
        (["-o", str(blosc_trace)], "is the input"),
        (["-o", str(link)], "is the input"),
        (["-o", str(other)], "HDF5 file"),
        (["-o", str(tmp_path)], "is a directory"),
        (["-o", os.devnull], "device or pipe"),
        (["-o", str(tmp_path / "missing" / "x.h5")], "does not exist"),
        (["-o", str(tmp_path / "x.h5"), "--compression", "zstd"], "--compression"),
    ]
    for extra, fragment in cases:
        assert main(["convert", str(blosc_trace), *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("codl convert: error: ") and fragment in err, (extra, err)
        assert "Traceback" not in err
    assert main(["convert", str(tmp_path / "nope.h5"), "-o", str(tmp_path / "y.h5")]) == 2
    assert "no such trace file" in capsys.readouterr().err
    assert other.read_bytes() == before
    assert not (tmp_path / "x.h5").exists() and not (tmp_path / "y.h5").exists()
    # No temporary file of a refused or finished unit is left behind.
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".codl-unit")]
    with h5py.File(blosc_trace, "r") as f:
        assert np.asarray(f["events/app/start_ns"]).size > 0
