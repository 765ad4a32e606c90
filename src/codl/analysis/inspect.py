"""`codl inspect`: what a trace holds, for a person or (``--json``) a script."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from codl.trace.schema import Phase, Table
from codl.trace.store import Trace, open_trace
from codl.trace.store.layout import FILTER_IDS


def read_hint(codec: str | None) -> str:
    """How to read a trace's columns without codl, for the codec they are stored with."""
    if codec == "gzip" or codec is None:
        return "any HDF5 reader (h5py, h5dump, xarray) reads the columns without a plugin"
    if codec == "lzf":
        return "h5py reads the columns; other HDF5 tools need the LZF filter plugin"
    import hdf5plugin

    return (
        "HDF5 tools need the Blosc plugin: `import hdf5plugin` before h5py opens it, or "
        f"HDF5_PLUGIN_PATH={hdf5plugin.PLUGIN_PATH} for h5dump and other HDF5 readers; "
        "`codl convert TRACE -o OUT.h5` writes a gzip copy any HDF5 reader opens"
    )


def describe(path: Path, *, allow_incomplete: bool = False) -> dict[str, Any]:
    with open_trace(path, allow_incomplete=allow_incomplete) as t:
        attrs = t.attrs
        spec = t.spec
        tables = {name: _checked_rows(t, name) for name in t.tables()}
        app = t.table(Table.APP)
        warm = int(attrs.get("warmup_steps", 0))
        measured = app[(app["phase"] == Phase.STEP.value) & (app["step"] >= warm)]
        dur = (measured["end_ns"] - measured["start_ns"]) / 1e6
        threads = t.table(Table.THREADS)
        roles = threads.drop_duplicates("tid")["role"].astype(str).value_counts().to_dict()
        codec = t.codec
        return {
            "path": str(path),
            "compression": codec,
            "hdf5_filter_id": FILTER_IDS.get(codec or ""),
            "read_without_codl": read_hint(codec),
            "run_id": attrs.get("run_id"),
            "complete": bool(attrs.get("complete", False)),
            "incomplete_reason": attrs.get("incomplete_reason", ""),
            "schema_version": attrs.get("schema_version"),
            "mode": spec.get("mode"),
            "device": spec.get("device"),
            "model": spec.get("workload", {}).get("model"),
            "policy": spec.get("pinning", {}).get("policy"),
            "workers": spec.get("loader", {}).get("workers"),
            "world_size": attrs.get("world_size", 1),
            "host": attrs.get("host"),
            "git_revision": attrs.get("git_revision"),
            "duration_s": _duration_s(attrs),
            "anchor_error_ns": attrs.get("anchors_start", {}).get("error_ns"),
            "measured_steps": len(measured),
            "step_ms_median": float(dur.median()) if len(dur) else None,
            "rows": tables,
            "thread_roles": {str(k): int(v) for k, v in roles.items()},
            "placement": attrs.get("placement"),
            "placement_mismatches": attrs.get("placement_mismatches", []),
            "versions": attrs.get("versions", {}),
            "clock_alignment": clock_summary(attrs),
        }


def _duration_s(attrs: dict[str, Any]) -> float | None:
    """The run's span from its root attributes; None where the trace does not give both ends
    (both are optional in the format: the tracer writes them, other writers need not)."""
    begin, end = attrs.get("t_begin_ns"), attrs.get("t_end_ns")
    if begin is None or end is None:
        return None
    return (int(end) - int(begin)) / 1e9


def _checked_rows(t: Trace, name: str) -> int:
    """Table ``name``'s rows, read block by block and checked as ``Trace.verify`` checks
    them: a long run's events/cuda read whole (10^8 events: ~28 s, 5.8 GiB) only to be counted
    is what a first look at a trace must not cost."""
    return sum(hi - lo for lo, hi, _ in t.verified_blocks(name, reuse=True))


def clock_summary(attrs: dict[str, Any]) -> dict[str, Any] | None:
    """How a multi-rank trace's ranks were put on rank 0's clock; None for one rank."""
    info = attrs.get("clock_alignment")
    if not isinstance(info, dict):
        return None
    ranks = info.get("ranks", [])
    moved = [a for a in ranks if not a.get("same_clock")]
    return {
        "applied": bool(info.get("applied")),
        "ranks_on_other_clocks": len(moved),
        "max_abs_offset_ns": max((abs(int(a["offset_ns"])) for a in moved), default=0),
        "max_drift_ppb": max((abs(float(a["drift_ppb"])) for a in moved), default=0.0),
        "bound_ns": max((int(a["bound_ns"]) for a in ranks), default=0),
    }


def render(info: dict[str, Any]) -> str:
    state = "complete" if info["complete"] else f"INCOMPLETE: {info['incomplete_reason']}"
    lines = [
        f"trace      {info['path']}",
        f"run        {info['run_id']}  ({state})",
        f"spec       mode={info['mode']} device={info['device']} model={info['model']} "
        f"policy={info['policy']} workers={info['workers']} ranks={info['world_size']}",
        f"host       {info['host']}  git {str(info['git_revision'] or '')[:10] or '-'}",
        (
            f"duration   {info['duration_s']:.2f} s"
            if info["duration_s"] is not None
            else "duration   unknown (no t_begin_ns and t_end_ns root attributes)"
        )
        + f"; anchor error +-{info['anchor_error_ns']} ns",
    ]
    if info["step_ms_median"] is not None:
        lines.append(
            f"steps      {info['measured_steps']} measured, median {info['step_ms_median']:.2f} ms"
        )
    codec = info["compression"]
    lines.append(
        f"codec      {codec} (HDF5 filter {info['hdf5_filter_id']}): {info['read_without_codl']}"
        if codec
        else f"codec      none: {info['read_without_codl']}"
    )
    lines.append("tables     " + ", ".join(f"{k}={v}" for k, v in sorted(info["rows"].items())))
    lines.append(
        "threads    " + ", ".join(f"{k}={v}" for k, v in sorted(info["thread_roles"].items()))
    )
    ca = info.get("clock_alignment")
    if ca is not None:
        lines.append(
            f"clocks     {ca['ranks_on_other_clocks']} rank(s) on another clock than rank 0, "
            f"max offset {ca['max_abs_offset_ns']} ns, drift {ca['max_drift_ppb']:.0f} ppb; "
            + (
                f"aligned to rank 0 within +-{ca['bound_ns']} ns"
                if ca["applied"]
                else "NOT aligned (no measured offset)"
            )
        )
    for m in info["placement_mismatches"]:
        lines.append(f"MISMATCH   {m}")
    return "\n".join(lines)
