"""`codl export --from/--to` take the axis the export writes: a time read off an exported file
(the JSON's ``ts``, the protobuf's packet timestamps, Perfetto's timecode of either) selects the
same instant when fed back, for every format `codl export` writes.

Real small traces: the golden two-rank CPU run (its first event 7.6 s after the run began, so an
axis counted from the first exported event is visibly wrong) and rank 0 of the real Kineto
fixture (CUPTI kernels, copies and runtime calls) put on its run's clock by codl's own
conversion.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from codl.cli import main
from codl.trace.store import TraceWriter, open_trace

TESTS = Path(__file__).resolve().parent
GOLDEN = TESTS / "golden" / "traces" / "r2_combined.h5.gz"
KINETO = TESTS / "fixtures" / "kineto-2rank"
FORMATS = ("chrome-json", "perfetto-proto")

# One exported event: where it is drawn, its name, start and end in ns on the export's axis.
Event = tuple[str, str, int, int]


def _golden(path: Path) -> Path:
    with gzip.open(GOLDEN, "rb") as src:
        path.write_bytes(src.read())
    return path


def _kineto(path: Path) -> Path:
    """Rank 0 of the Kineto fixture as a codl trace: its step spans and CUPTI events on the
    run's CLOCK_MONOTONIC (codl.trace.kineto.convert), the run beginning at its start anchor."""
    from codl.trace.clock import Anchor
    from codl.trace.kineto import convert

    side = json.loads((KINETO / "rank0.codl.json").read_text())
    with gzip.open(KINETO / "rank0.pt.trace.json.gz", "rt") as f:
        doc = json.load(f)

    class Spans:
        rows = side["spans"]

    cols, _ = convert(doc, Spans(), Anchor(**side["anchor"]))
    spans = side["spans"]
    n = len(spans["step"])
    with TraceWriter(path) as w:
        w.set_attrs(
            run_id="k1net0",
            anchors_start=side["anchor"],
            t_begin_ns=side["anchor"]["monotonic_ns"],
            t_end_ns=max(*spans["end_ns"], *cols["end_ns"]),
        )
        w.append("events/app", {**spans, "tid": [1] * n, "gpu_ns": [-1] * n})
        w.append("events/cuda", cols)
        return w.finish()


TRACES = {"golden r2_combined": _golden, "kineto rank 0": _kineto}


@pytest.fixture(scope="module", params=list(TRACES))
def trace(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if request.param.startswith("kineto") and not KINETO.is_dir():
        pytest.skip(f"{KINETO} is absent (scripts/kineto_fixture.py makes it)")
    d = tmp_path_factory.mktemp(request.param.replace(" ", "_"))
    return TRACES[request.param](d / "trace.h5")


def export(trace: Path, out: Path, fmt: str, *window: str) -> Path:
    argv = ["export", str(trace), "-o", str(out), "--format", fmt]
    if window:
        argv += ["--from", window[0], "--to", window[1]]
    assert main(argv) == 0
    return out


def read(out: Path, fmt: str) -> tuple[int, list[Event], list[tuple[str, int]], list[int]]:
    """(the axis's 0 as CLOCK_MONOTONIC ns, the trace's slices, its counter samples by track
    name, every timestamp in the file), all times in ns as the file writes them."""
    if fmt == "chrome-json":
        doc = json.loads(out.read_text(encoding="utf-8"))
        zero = int(doc["otherData"]["time_base_monotonic_ns"])
        evs = [e for e in doc["traceEvents"] if e["ph"] != "M"]

        def ns(us: float) -> int:
            return round(us * 1000)

        slices = [
            (f"{e['pid']}/{e['tid']}", e["name"], ns(e["ts"]), ns(e["ts"] + e["dur"]))
            for e in evs
            if e["ph"] == "X" and e["cat"] != "axis"
        ]
        counters = [(f"{e['pid']} {e['name']}", ns(e["ts"])) for e in evs if e["ph"] == "C"]
        return zero, slices, counters, [ns(e["ts"]) for e in evs]
    from test_perfetto_proto import parse

    got = parse(out.read_bytes())
    events = [(got.where(s), s.name, s.start, s.end) for s in got.slices if s.cat != "axis"]
    counters = [
        (got.where_track(uuid), ts) for uuid, values in got.counters.items() for ts, _ in values
    ]
    stamps = [s.start for s in got.slices + got.instants] + [ts for _, ts in counters]
    return got.zero_monotonic(), events, counters, stamps


def overlaps(e: Event, lo: int, hi: int) -> bool:
    """The trace reader's window rule: an event overlapping [lo, hi), or an instant in it."""
    return e[2] < hi and (e[3] > lo or e[2] >= lo)


def timecode(ns: int) -> str:
    """``ns`` as Perfetto's UI writes a time: HH:MM:SS.mmm uuu nnn."""
    s, sub = divmod(ns, 10**9)
    return f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{sub // 10**6:03d} " + (
        f"{sub // 1000 % 1000:03d} {sub % 1000:03d}"
    )


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("spelling", ["file's unit", "seconds", "timecode", "mono"])
def test_a_time_read_off_an_export_selects_its_event(
    trace: Path, tmp_path: Path, fmt: str, spelling: str
) -> None:
    if fmt == "perfetto-proto":
        pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    ext = "json" if fmt == "chrome-json" else "pftrace"
    zero, events, counters, stamps = read(export(trace, tmp_path / f"whole.{ext}", fmt), fmt)
    with open_trace(trace) as t:
        begin = t.attrs["t_begin_ns"]
    # The zero is the run's start, stated in the file; the file's first timestamp is that 0
    # (the axis's own instant), where Perfetto's timecode counts from.
    assert zero == begin and min(stamps) == 0
    assert min(e[2] for e in events) > 0
    # An event from the middle of the run, and a window from its start to 300 ms later.
    pick = sorted(events, key=lambda e: e[2])[len(events) // 2]
    lo, hi = pick[2], pick[2] + 300_000_000
    if spelling == "file's unit":
        window = (
            (f"{pick[2] / 1000!r}us", f"{hi / 1000!r}us")
            if ext == "json"
            else (
                f"{lo}ns",
                f"{hi}ns",
            )
        )
    elif spelling == "seconds":
        window = (f"{lo / 1e9:.9f}", f"{hi / 1e9:.9f}")
    elif spelling == "timecode":
        window = (timecode(lo), timecode(hi))
    else:
        window = (f"mono:{begin + lo}", f"mono:{begin + hi}")
    w_zero, w_events, w_counters, _ = read(
        export(trace, tmp_path / f"window.{ext}", fmt, *window), fmt
    )
    assert w_zero == zero  # the window's export keeps the run's axis
    assert pick in w_events
    assert sorted(w_events) == sorted(e for e in events if overlaps(e, lo, hi))
    assert sorted(w_counters) == sorted(c for c in counters if lo <= c[1] < hi)
    assert len(w_events) < len(events)  # the window left events out


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_window_outside_the_run_names_its_span_on_the_axis(
    trace: Path, tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if fmt == "perfetto-proto":
        pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    out = tmp_path / "w.out"
    argv = ["export", str(trace), "-o", str(out), "--format", fmt]
    assert main([*argv, "--from", "100", "--to", "200000ms"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(trace) in err and "Traceback" not in err
    assert "no event in the window [100 s, 200 s) (seconds since the run began)" in err
    assert "the run spans 0 s to " in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "ns", "monotonic"),
    [
        ("10.2", 10_200_000_000, False),
        ("10.2s", 10_200_000_000, False),
        ("10200ms", 10_200_000_000, False),
        ("10200000.001us", 10_200_000_001, False),
        ("10200000001ns", 10_200_000_001, False),
        ("1e-9", 1, False),
        ("00:00:10.200 000 001", 10_200_000_001, False),
        ("00:00:10.200\u2009000\u2009001", 10_200_000_001, False),  # as Perfetto copies it
        ("01:02:03", 3_723_000_000_000, False),
        ("1d00:00:00.5", 86_400_500_000_000, False),
        ("mono:3228236220310", 3_228_236_220_310, True),
    ],
)
def test_every_spelling_of_a_time(text: str, ns: int, monotonic: bool) -> None:
    from codl.cli.options import export_time

    assert export_time(text) == (ns, monotonic)


@pytest.mark.parametrize(
    "text", ["10.2 s s", "00:61:00", "00:00:01.1234567891", "mono:1.5", "mono:-1", "1h", "1e7000"]
)
def test_a_malformed_time_is_one_line_naming_the_option(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["export", str(tmp_path / "t.h5"), "-o", str(tmp_path / "o.json"), "--from", text])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert err.startswith("codl export: error: argument --from: got ") and "mono:NS" in err
