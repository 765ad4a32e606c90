"""Issue 37, class 6: traces whose content breaks the schema's promises.

A real trace (a tiny CPU run: one rank, and two ranks merged onto rank 0's clock) is damaged
the way an edit that recomputes every checksum would: a root attribute of the wrong type or
missing a part (the clock alignment's bound as text, an entry without its offset, ...), or
events that end before they start. Every command that reads it (inspect, summarize, export)
must refuse it with one line naming the damaged attribute or table, exit 2, write nothing and
leave the trace as it was; the one mechanism is the reader's (``open_trace`` checks the root
attributes against ``schemas/trace-attrs.schema.yaml``, every read of an event block checks
its times).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from codl.cli import main
from codl.errors import TraceFormatError

TINY = {"workload": {"batch_size": 2, "image_size": 16}, "steps": {"warmup": 1, "measured": 2}}


@pytest.fixture(scope="module")
def real_traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One complete trace of a 1-rank compute run and one merged trace of a 2-rank compute+comm
    run (gloo): its clock_alignment and ranks attributes are the merge's own."""
    from codl.harness.launch import launch
    from codl.spec import RunSpec

    root = tmp_path_factory.mktemp("promises")
    out = {"one rank": root / "one" / "trace.h5", "two ranks": root / "two" / "trace.h5"}
    for path in out.values():
        path.parent.mkdir()
    launch(
        RunSpec.from_dict({"mode": "compute", **TINY}), trace_path=out["one rank"], dataset_dir=None
    )
    two = {"mode": "compute+comm", "layout": {"ranks_per_node": 2}, **TINY}
    launch(RunSpec.from_dict(two), trace_path=out["two ranks"], dataset_dir=None)
    return out


def copy_of(real_traces: dict[str, Path], which: str, tmp_path: Path) -> Path:
    p = tmp_path / "in" / "trace.h5"
    p.parent.mkdir()
    shutil.copy(real_traces[which], p)
    return p


def edit_attrs(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``change`` to the root attributes (JSON ones decoded) and store them back with the
    metadata digest recomputed: only the content is wrong."""
    import h5py

    from codl.trace.store import DIGEST_ATTR
    from codl.trace.store.layout import metadata_digest, plain_value

    with h5py.File(path, "r+") as f:
        json_names = set(json.loads(plain_value(f.attrs["json_attrs"])))
        attrs = {
            k: json.loads(plain_value(v)) if k in json_names else plain_value(v)
            for k, v in f.attrs.items()
        }
        before = dict(attrs)
        change(attrs)
        for k in set(before) - set(attrs):
            del f.attrs[k]
        for k, v in attrs.items():
            if k in json_names:
                f.attrs[k] = json.dumps(v)
            elif v != before.get(k):
                f.attrs[k] = v
        f.attrs[DIGEST_ATTR] = metadata_digest(f)


def end_before_start(path: Path) -> None:
    """The first step's span of events/app ends 1 ns before it starts; the column digest, the
    chunk index and the metadata digest recomputed."""
    import h5py

    from codl.trace.store import DIGEST_ATTR
    from codl.trace.store.layout import (
        CHUNK_INDEX,
        COLUMN_DIGEST_ATTR,
        column_hasher,
        metadata_digest,
        plain_value,
        time_range,
    )

    with h5py.File(path, "r+") as f:
        group = f["events/app"]
        rows = int(group.attrs["rows"])
        end = group["end_ns"]
        end[0] = group["start_ns"][0] - 1
        digests = json.loads(group.attrs["sha256"])
        values = np.ascontiguousarray(end[:rows])
        # The digest of the trace's own algorithm (sha256 in traces written before crc32).
        digest = column_hasher(plain_value(f.attrs.get(COLUMN_DIGEST_ATTR, "sha256")))
        digest.update(values.data.cast("B"))
        digests["end_ns"] = digest.hexdigest()
        group.attrs["sha256"] = json.dumps(digests)
        index = f.get(f"{CHUNK_INDEX}/events/app")
        if index is not None:
            data = np.asarray(index[()], dtype=np.int64)
            for i, (lo, hi, _, _) in enumerate(data.tolist()):
                cols = {c: group[c][lo:hi] for c in ("start_ns", "end_ns")}
                data[i, 2:] = time_range("events/app", cols, hi - lo)
            index[...] = data
            index.attrs["sha256"] = hashlib.sha256(data.tobytes()).hexdigest()
        f.attrs[DIGEST_ATTR] = metadata_digest(f)


def _alignment_entry(a: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = a["clock_alignment"]["ranks"][1]
    return entry


# (label, which trace, the damage, what the error must name)
ATTR_FAULTS: list[tuple[str, str, Callable[[dict[str, Any]], None], str]] = [
    (
        "a clock-alignment bound as text",
        "two ranks",
        lambda a: _alignment_entry(a).update(bound_ns="12 us"),
        "clock_alignment.ranks[1].bound_ns",
    ),
    (
        "a clock-alignment entry without its offset",
        "two ranks",
        lambda a: _alignment_entry(a).pop("offset_ns"),
        "clock_alignment.ranks[1]: 'offset_ns' is a required property",
    ),
    (
        "clock alignment applied as text",
        "two ranks",
        lambda a: a["clock_alignment"].update(applied="yes"),
        "clock_alignment.applied",
    ),
    (
        "clock alignment without its ranks",
        "two ranks",
        lambda a: a["clock_alignment"].pop("ranks"),
        "clock_alignment: 'ranks' is a required property",
    ),
    (
        "a rank's begin time as text",
        "two ranks",
        lambda a: a["ranks"][1].update(t_begin_ns="soon"),
        "ranks[1].t_begin_ns",
    ),
    (
        "a rank's clock sample without its bound",
        "two ranks",
        lambda a: a["ranks"][1]["clock_sync"]["start"].pop("bound_ns"),
        "ranks[1].clock_sync.start: 'bound_ns' is a required property",
    ),
    (
        "ranks as a number",
        "two ranks",
        lambda a: a.update(ranks=2),
        "ranks: 2 is not of type 'array'",
    ),
    (
        "the run ends before it starts",
        "one rank",
        lambda a: a.update(t_end_ns=a["t_begin_ns"] - 1),
        "t_end_ns",
    ),
    (
        "an anchor without its error",
        "one rank",
        lambda a: a["anchors_start"].pop("error_ns"),
        "anchors_start: 'error_ns' is a required property",
    ),
    (
        "a negative warm-up",
        "one rank",
        lambda a: a.update(warmup_steps=-1),
        "warmup_steps: -1 is less than the minimum of 0",
    ),
    (
        "world size zero",
        "one rank",
        lambda a: a.update(world_size=0),
        "world_size: 0 is less than the minimum of 1",
    ),
    (
        "the spec as a list",
        "one rank",
        lambda a: a.update(spec=[1, 2]),
        "spec: [1, 2] is not of type 'object'",
    ),
    (
        "clock ticks as text",
        "one rank",
        lambda a: a.update(clk_tck="100"),
        "clk_tck: '100' is not of type 'integer'",
    ),
]

COMMANDS = {
    "inspect": lambda trace, out: ["inspect", str(trace)],
    "inspect --json": lambda trace, out: ["inspect", "--json", str(trace)],
    "summarize": lambda trace, out: ["summarize", str(trace), "--out-dir", str(out)],
    "export": lambda trace, out: ["export", str(trace), "-o", str(out / "trace.json")],
}


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def refused_by_every_command(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], expected: str
) -> None:
    """Each command exits 2 with one line naming ``expected``, writes nothing, and leaves
    the trace and its directory as they were."""
    before = tree(trace.parent)
    for name, argv in COMMANDS.items():
        out = tmp_path / f"out {name}"
        out.mkdir()
        capsys.readouterr()
        rc = main(["--log-level", "WARNING", *argv(trace, out)])
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert rc == 2, (name, captured.err)
        assert len(lines) == 1 and expected in lines[0], (name, captured.err)
        assert str(trace) in lines[0], (name, lines)
        assert captured.out == "", (name, captured.out)
        assert sorted(p.name for p in out.iterdir()) == [], name
        assert tree(trace.parent) == before, name


@pytest.mark.parametrize(
    ("label", "which", "change", "expected"), ATTR_FAULTS, ids=[f[0] for f in ATTR_FAULTS]
)
def test_a_damaged_root_attribute_is_one_error_naming_it_in_every_command(
    real_traces: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    label: str,
    which: str,
    change: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    trace = copy_of(real_traces, which, tmp_path)
    edit_attrs(trace, change)
    refused_by_every_command(trace, tmp_path, capsys, f"root attribute {expected}")


@pytest.mark.parametrize("which", ["one rank", "two ranks"])
def test_events_ending_before_they_start_are_refused_by_every_command(
    real_traces: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    trace = copy_of(real_traces, which, tmp_path)
    end_before_start(trace)
    refused_by_every_command(trace, tmp_path, capsys, "/events/app has 1+ event(s) ending before")


def test_the_untouched_traces_and_an_unchanged_rewrite_pass(
    real_traces: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The damage helpers change only what they say: rewriting the attributes as they are
    leaves a trace every command accepts (so each refusal above is the planted fault's)."""
    from codl.trace.store import open_trace

    for which, real in real_traces.items():
        trace = tmp_path / which / "trace.h5"
        trace.parent.mkdir()
        shutil.copy(real, trace)
        edit_attrs(trace, lambda a: None)
        with open_trace(trace) as t:
            t.verify()
        for name, argv in COMMANDS.items():
            out = tmp_path / which / f"out {name}"
            out.mkdir()
            assert main(argv(trace, out)) == 0, (which, name, capsys.readouterr().err)


def test_the_merged_trace_keeps_the_promises_the_faults_break(real_traces: dict[str, Path]) -> None:
    """The real merged trace has what the faults damage, with the promised types."""
    from codl.trace.store import open_trace

    with open_trace(real_traces["two ranks"]) as t:
        ca = t.attrs["clock_alignment"]
        assert [a["rank"] for a in ca["ranks"]] == [0, 1]
        assert all(isinstance(a["bound_ns"], int) for a in ca["ranks"])
        assert [r["rank"] for r in t.attrs["ranks"]] == [0, 1]
        assert isinstance(t.attrs["ranks"][1]["clock_sync"]["start"]["bound_ns"], int)


def test_a_windowed_read_refuses_the_damaged_events_too(
    real_traces: dict[str, Path], tmp_path: Path
) -> None:
    """The check is the reader's, on every path that reads both times: whole tables, blocks,
    windows and raw rows."""
    from codl.trace.store import open_trace

    trace = copy_of(real_traces, "one rank", tmp_path)
    end_before_start(trace)
    with open_trace(trace) as t:
        n = len(t.table("threads"))
        assert n > 0  # other tables read as before
        begin, end = int(t.attrs["t_begin_ns"]), int(t.attrs["t_end_ns"])
        reads: list[Callable[[], object]] = [
            lambda: t.table("events/app"),
            lambda: t.table("events/app", t0=begin, t1=end + 1),
            lambda: list(t.iter_blocks("events/app")),
            lambda: list(t.iter_blocks("events/app", ["start_ns", "end_ns"], t0=begin)),
            lambda: t.read_rows("events/app", 0, 1),
            t.verify,
        ]
        for read in reads:
            with pytest.raises(TraceFormatError, match="ending before they start"):
                read()
        # One column alone is no claim about durations: still readable.
        assert len(t.read_rows("events/app", 0, 1, ["start_ns"])["start_ns"]) == 1
