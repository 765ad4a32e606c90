"""Peak memory and rate of `codl export`: the streamed Perfetto protobuf against Chrome JSON.

Makes synthetic traces of ``--events`` sizes (benchmarks/synth_trace.py: a 4-rank `combined`
run at the `cuda_api` level, ~70 % CUDA runtime calls, ~26 % loader rows) and exports each,
whole, in a fresh process per export, which reports its peak RSS (``ru_maxrss``), its RSS
after the imports and the open (the floor), the time, and the output's size. The JSON export
is run only up to ``--json-max`` events (it holds one dict per event).

    PYTHONPATH=src python benchmarks/perfetto_export_cost.py [--events 250000 1000000 3000000]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from codl.trace.export import export_chrome
from codl.trace.perfetto_proto import export_perfetto, _pb
from codl.trace.store import open_trace
fmt, trace, out = sys.argv[1:4]
_pb()
with open_trace(trace) as t:
    t.attrs
floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
(export_perfetto if fmt == "perfetto-proto" else export_chrome)(trace, out)
dt = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"floor_mib": floor / 1024, "peak_mib": peak / 1024, "seconds": dt,
                  "bytes": Path(out).stat().st_size}))
"""


def _measure(fmt: str, trace: Path, out: Path) -> dict[str, float]:
    got = subprocess.run(
        [sys.executable, "-c", _CHILD, fmt, str(trace), str(out)],
        check=True,
        capture_output=True,
        text=True,
    )
    out.unlink()
    return json.loads(got.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, nargs="+", default=[250_000, 1_000_000, 3_000_000])
    p.add_argument("--json-max", type=int, default=1_000_000)
    p.add_argument("--csv", type=Path, default=Path("benchmarks/results/perfetto_export_cost.csv"))
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from synth_trace import make_trace

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.events:
            trace = Path(tmp) / f"t{n}.h5"
            events = make_trace(trace, n)
            for fmt in ("perfetto-proto", "chrome-json"):
                if fmt == "chrome-json" and n > args.json_max:
                    continue
                m = _measure(fmt, trace, Path(tmp) / f"out{n}.{fmt}")
                rows.append(
                    {
                        "format": fmt,
                        "events": events,
                        "peak_rss_mib": round(m["peak_mib"], 1),
                        "floor_rss_mib": round(m["floor_mib"], 1),
                        "seconds": round(m["seconds"], 2),
                        "us_per_event": round(m["seconds"] / events * 1e6, 2),
                        "bytes_per_event": round(m["bytes"] / events, 1),
                    }
                )
                print(rows[-1], flush=True)
            trace.unlink()
    cols = list(rows[0])
    print("  ".join(f"{c:>15}" for c in cols))
    for r in rows:
        print("  ".join(f"{r[c]!s:>15}" for c in cols))
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    print(args.csv)


if __name__ == "__main__":
    main()
