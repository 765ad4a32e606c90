"""Repack an hdf5plugin wheel with only the HDF5 filters CoDL's traces use (Blosc).

hdf5plugin ships a dozen compression filters (46 MB as a wheel, 98 MB of it SZ3 alone); a trace
needs one (``trace.compression: blosc-lz4``, docs/trace-format.md). The GPU node gets its wheels
through a transfer capped at 64 MiB (scripts/h200.sh, ``.whl/``), where the full wheel does not
fit. The slim wheel keeps the Python package whole, drops the other filters' libraries, lists
only the kept ones in the build config (so that ``import hdf5plugin`` does not try to load the
missing ones), and rewrites RECORD with the new hashes.

    python scripts/slim_hdf5plugin.py FULL.whl OUT_DIR [--keep blosc ...]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

PLUGIN = re.compile(r"^hdf5plugin/plugins/libh5(?P<name>[a-z0-9]+)\.[a-z]+$")
EMBEDDED = re.compile(r"'embedded_filters': \([^)]*\)")


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim(wheel: Path, out_dir: Path, keep: tuple[str, ...]) -> Path:
    """Write the slim wheel (same file name) into ``out_dir`` and return its path."""
    if not wheel.name.startswith("hdf5plugin-"):
        raise SystemExit(f"{wheel}: expected an hdf5plugin wheel")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / wheel.name
    if out.resolve() == wheel.resolve():
        raise SystemExit(f"{out}: would overwrite the input; choose another OUT_DIR")
    kept_libs: list[str] = []
    records: list[str] = []
    record_name = ""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            name = info.filename
            if name.endswith(".dist-info/RECORD"):
                record_name = name
                continue
            m = PLUGIN.match(name)
            if m and m.group("name") not in keep:
                continue
            data = src.read(info)
            if m:
                kept_libs.append(m.group("name"))
            if name == "hdf5plugin/_config.py":
                listed = ", ".join(f"'{k}'" for k in keep)
                text, n = EMBEDDED.subn(f"'embedded_filters': ({listed},)", data.decode())
                if n != 1:
                    raise SystemExit(f"{wheel}: {name} has no embedded_filters entry to rewrite")
                data = text.encode()
            dst.writestr(info, data)
            records.append(_record_line(name, data))
        if not record_name:
            raise SystemExit(f"{wheel}: no .dist-info/RECORD")
        missing = sorted(set(keep) - set(kept_libs))
        if missing:
            raise SystemExit(f"{wheel}: no filter library for {missing}")
        records.append(f"{record_name},,")
        dst.writestr(record_name, "\n".join(records) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("wheel", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--keep", nargs="+", default=["blosc"], help="filters to keep (default blosc)")
    args = p.parse_args(argv)
    out = slim(args.wheel, args.out_dir, tuple(args.keep))
    print(f"{out} ({out.stat().st_size / 1e6:.1f} MB, filters: {', '.join(args.keep)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
