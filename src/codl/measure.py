"""One measurement type for benchmarks and experiments, and the tables rendered from it.

A ``Measurement`` is what one benchmark (or one experiment's comparison) says about one thing it
timed: the value of every round, how many items each round's value summarises (``n``), the
statistic that made a round's value out of its items, and where and when it was measured: the
machine, the load average at its start and end, the commit (and whether the tree was dirty), the
date and the command line. Its headline numbers (median, min, max, mean, stdev over rounds) are
derived, never typed in, so a table cannot disagree with the rounds it came from.

Modelled on ``torch.utils.benchmark`` (a ``Measurement`` object rendered by ``Compare``: rows are
measurements, columns a setting, ratios against a baseline column) and on pyperf (the process is
the sample, mean +- std over processes, a warning when the result may be unstable). pyperf itself
is not used: it spawns its own worker processes around a callable, while our benchmarks time
whole commands and training runs end to end, rounds interleaved by hand so that drift hits every
variant alike.

One CSV schema holds any list of measurements (``write_csv``/``read_csv``): one row per
measurement, the derived statistics as columns for eyes and spreadsheets, the settings and the
raw rounds as JSON columns so that a reader gets the whole object back.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "COLUMNS",
    "PAIRED",
    "Context",
    "Machine",
    "Measurement",
    "Recorder",
    "bootstrap_median",
    "load_average",
    "paired",
    "read_csv",
    "table",
    "write_csv",
]

# pyperf warns when the standard deviation is above a tenth of the mean: a benchmark whose
# rounds spread that much measures the machine's weather as much as the code.
UNSTABLE_SPREAD = 0.10
# The load average counts the benchmark's own threads too, so only more runnable tasks than
# cores says for sure that something waited for a CPU during the measurement.
BUSY_LOAD_PER_CORE = 1.0


def load_average() -> float:
    """The one-minute load average (runnable + uninterruptible tasks), NaN where the OS has none."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return math.nan


@dataclass(frozen=True)
class Machine:
    """The machine a measurement ran on: enough to tell two tables' hardware apart."""

    hostname: str
    cpu: str
    cores: int
    gpu: str = ""

    @classmethod
    def current(cls) -> Machine:
        return cls(
            hostname=socket.gethostname(),
            cpu=_cpu_model(),
            # The cores this process may run on (a Slurm job's or taskset's share), not the node's.
            cores=len(os.sched_getaffinity(0)),
            gpu=_gpu_name(),
        )

    def __str__(self) -> str:
        gpu = f", {self.gpu}" if self.gpu else ""
        return f"{self.hostname} ({self.cpu}, {self.cores} cores{gpu})"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_name() -> str:
    """GPU 0's name through NVML; through torch only if the caller already imported it, since
    importing torch to name a GPU would cost a CPU benchmark seconds and load CUDA."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no NVML library, no driver, no GPU: each means "none" here
        pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return str(torch.cuda.get_device_name(0))
    return ""


def _git(*args: str) -> str:
    # The package's own checkout, not the caller's working directory: the commit of the code
    # that was measured, wherever the benchmark was started from.
    here = Path(__file__).resolve().parent
    proc = subprocess.run(
        ["git", "-C", str(here), *args], capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() if proc.returncode == 0 else ""


@dataclass(frozen=True)
class Context:
    """What every measurement of one process shares: machine, commit, date, command line."""

    machine: Machine
    commit: str
    dirty: bool
    date: str
    command: str

    @classmethod
    def current(cls, argv: Sequence[str] | None = None) -> Context:
        commit = _git("rev-parse", "HEAD")
        return cls(
            machine=Machine.current(),
            commit=commit or "unknown",
            # Untracked files change nothing that was measured; modified tracked files do.
            dirty=bool(commit) and bool(_git("status", "--porcelain", "--untracked-files=no")),
            date=datetime.now(UTC).isoformat(timespec="seconds"),
            command=shlex.join(sys.argv if argv is None else argv),
        )

    @property
    def revision(self) -> str:
        return self.commit[:12] + ("+dirty" if self.dirty else "")


# The statistic of a paired measurement (``paired``): each round is one pair's ratio.
PAIRED = "paired ratio"


@dataclass(frozen=True)
class Measurement:
    """The rounds of one measured thing, and where and when they were measured.

    ``values`` holds one value per round (each the ``statistic`` over that round's ``n`` items,
    e.g. the median of 40 step times); ``settings`` says which variant it is (the table's rows
    and columns come from them).
    """

    name: str
    unit: str
    values: tuple[float, ...]
    n: tuple[int, ...]
    context: Context
    load_start: float
    load_end: float
    statistic: str = "value"
    settings: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"measurement {self.name!r}: no rounds")
        if len(self.n) != len(self.values):
            raise ValueError(
                f"measurement {self.name!r}: {len(self.values)} rounds but {len(self.n)} n's"
            )

    @property
    def rounds(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    @property
    def min(self) -> float:
        return min(self.values)

    @property
    def max(self) -> float:
        return max(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def stdev(self) -> float:
        return statistics.stdev(self.values) if self.rounds > 1 else 0.0

    @property
    def setting(self) -> dict[str, str]:
        return dict(self.settings)

    @property
    def spread(self) -> float:
        """stdev/mean over rounds (0 for one round): pyperf's instability signal."""
        return self.stdev / abs(self.mean) if self.rounds > 1 and self.mean else 0.0

    @property
    def unstable(self) -> bool:
        return self.spread > UNSTABLE_SPREAD

    @property
    def busy(self) -> bool:
        """Whether the machine was loaded beyond its cores at the start or end."""
        return max(self.load_start, self.load_end) > BUSY_LOAD_PER_CORE * self.context.machine.cores

    def label(self) -> str:
        return " ".join([self.name, *(f"{k}={v}" for k, v in self.settings)])

    def describe(self, digits: int = 3) -> str:
        """One line: ``median 2.14 s (min 1.55, max 2.17, 5 rounds of n=40)``, or for a paired
        ratio ``paired median 2.14x (min 1.55, max 2.17, 5 pairs)``."""
        what = "pairs" if self.statistic == PAIRED else "rounds"
        prefix = "paired median" if self.statistic == PAIRED else "median"
        unit = self.unit if self.unit == "x" else f" {self.unit}"
        ns = set(self.n)
        per = f" of n={self.n[0]}" if len(ns) == 1 and self.n[0] != 1 else ""
        return (
            f"{prefix} {_fmt(self.median, digits)}{unit} (min {_fmt(self.min, digits)}, "
            f"max {_fmt(self.max, digits)}, {self.rounds} {what}{per})"
        )


def paired(a: Measurement, b: Measurement, name: str | None = None) -> Measurement:
    """Round-by-round ratio a/b of two measurements whose rounds were interleaved (round i of
    each made back to back), so that drift between rounds cancels within a pair."""
    if a.rounds != b.rounds:
        raise ValueError(
            f"paired({a.name!r}, {b.name!r}): {a.rounds} and {b.rounds} rounds; pairs need both"
        )
    if a.unit != b.unit:
        raise ValueError(f"paired({a.name!r}, {b.name!r}): units {a.unit!r} and {b.unit!r}")
    common = {k: v for k, v in a.settings if b.setting.get(k) == v}
    return Measurement(
        name=name or f"{a.name} / {b.name}",
        unit="x",
        values=tuple(x / y for x, y in zip(a.values, b.values, strict=True)),
        n=tuple(1 for _ in a.values),
        context=a.context,
        load_start=max(a.load_start, b.load_start),
        load_end=max(a.load_end, b.load_end),
        statistic=PAIRED,
        settings=tuple(common.items()),
    )


def bootstrap_median(
    values: Sequence[float], n: int = 5000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float]:
    """A percentile-bootstrap interval of the median (seeded: the same rounds, the same table)."""
    a = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    meds = np.median(rng.choice(a, (n, len(a))), axis=1)
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(meds, [tail, 100 - tail])
    return float(lo), float(hi)


class Recorder:
    """Makes the measurements of one benchmark process, all with the same context.

    Each measurement's load is read when the previous one ended (or at ``mark()``/creation) and
    when it is added, so that sequential measurements each carry the load of their own span.
    Adding a measurement again (same name and settings) replaces it and keeps its load at
    start: a benchmark that rewrites its CSV after every round records its rounds so far.
    """

    def __init__(self, context: Context | None = None) -> None:
        self.context = context if context is not None else Context.current()
        self.measurements: list[Measurement] = []
        self._load = load_average()

    def mark(self) -> None:
        """Start the next measurement's span now (its load at start)."""
        self._load = load_average()

    def add(
        self,
        name: str,
        values: Iterable[float],
        /,
        *,
        unit: str,
        n: int | Iterable[int] = 1,
        statistic: str = "value",
        settings: Mapping[str, object] | None = None,
        **more: object,
    ) -> Measurement:
        """Record ``values`` (one per round) as a measurement. Its settings are the keywords
        beyond the fixed ones, after those of ``settings`` (for a dict built elsewhere, or a
        setting named like a keyword of this method); values become strings."""
        settings = {**(settings or {}), **more}
        vals = tuple(float(v) for v in values)
        ns = tuple(n for _ in vals) if isinstance(n, int) else tuple(int(k) for k in n)
        now = load_average()
        m = Measurement(
            name=name,
            unit=unit,
            values=vals,
            n=ns,
            context=self.context,
            load_start=self._load,
            load_end=now,
            statistic=statistic,
            settings=tuple((k, str(v)) for k, v in settings.items()),
        )
        self._load = now
        return self._keep(m)

    def paired(self, a: Measurement, b: Measurement, name: str | None = None) -> Measurement:
        return self._keep(paired(a, b, name))

    def _keep(self, m: Measurement) -> Measurement:
        for i, old in enumerate(self.measurements):
            if (old.name, old.settings) == (m.name, m.settings):
                m = replace(m, load_start=old.load_start)
                self.measurements[i] = m
                return m
        self.measurements.append(m)
        return m

    def get(self, name: str, **settings: object) -> Measurement:
        want = {k: str(v) for k, v in settings.items()}
        for m in self.measurements:
            if m.name == name and all(m.setting.get(k) == v for k, v in want.items()):
                return m
        raise KeyError(f"no measurement {name!r} with {want}")

    def write(self, path: Path) -> None:
        write_csv(path, self.measurements)


# One row per measurement. The derived statistics are columns so that a spreadsheet reads them;
# settings and the raw rounds are JSON so that read_csv gives the whole object back.
COLUMNS = (
    "name",
    "settings",
    "unit",
    "statistic",
    "rounds",
    "n",
    "median",
    "min",
    "max",
    "mean",
    "stdev",
    "values",
    "n_per_round",
    "hostname",
    "cpu",
    "cores",
    "gpu",
    "load_start",
    "load_end",
    "commit",
    "dirty",
    "date",
    "command",
)


def _row(m: Measurement) -> dict[str, Any]:
    c = m.context
    return {
        "name": m.name,
        "settings": json.dumps(m.setting, sort_keys=False),
        "unit": m.unit,
        "statistic": m.statistic,
        "rounds": m.rounds,
        "n": sum(m.n),
        "median": repr(m.median),
        "min": repr(m.min),
        "max": repr(m.max),
        "mean": repr(m.mean),
        "stdev": repr(m.stdev),
        # repr round-trips floats exactly: the file holds what was measured, not a rounding.
        "values": json.dumps(list(m.values)),
        "n_per_round": json.dumps(list(m.n)),
        "hostname": c.machine.hostname,
        "cpu": c.machine.cpu,
        "cores": c.machine.cores,
        "gpu": c.machine.gpu,
        "load_start": repr(m.load_start),
        "load_end": repr(m.load_end),
        "commit": c.commit,
        "dirty": int(c.dirty),
        "date": c.date,
        "command": c.command,
    }


def write_csv(path: Path, measurements: Iterable[Measurement]) -> None:
    """Write the measurements to ``path`` in the one schema (``COLUMNS``); folders are made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for m in measurements:
            w.writerow(_row(m))
    tmp.replace(path)


def read_csv(path: Path) -> list[Measurement]:
    """The measurements a ``write_csv`` file holds, statistics re-derived from the raw rounds."""
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(
                f"{path}: not a codl.measure CSV (missing columns {', '.join(missing)}); "
                "benchmark results written before codl.measure have their own columns"
            )
        return [_measurement(r) for r in reader]


def _measurement(r: Mapping[str, str]) -> Measurement:
    ctx = Context(
        machine=Machine(hostname=r["hostname"], cpu=r["cpu"], cores=int(r["cores"]), gpu=r["gpu"]),
        commit=r["commit"],
        dirty=r["dirty"] == "1",
        date=r["date"],
        command=r["command"],
    )
    return Measurement(
        name=r["name"],
        unit=r["unit"],
        values=tuple(float(v) for v in json.loads(r["values"])),
        n=tuple(int(v) for v in json.loads(r["n_per_round"])),
        context=ctx,
        load_start=float(r["load_start"]),
        load_end=float(r["load_end"]),
        statistic=r["statistic"],
        settings=tuple((k, str(v)) for k, v in json.loads(r["settings"]).items()),
    )


def _fmt(v: float, digits: int) -> str:
    if math.isnan(v):
        return "nan"
    if v == 0 or abs(v) >= 10 ** (digits - 1):
        return f"{v:,.0f}"
    # "#" keeps trailing zeros: 2.00 says three digits were measured, 2 would not.
    return f"{v:#.{digits}g}"


def _cell(m: Measurement, digits: int) -> str:
    if m.rounds == 1:
        return _fmt(m.median, digits)
    return f"{_fmt(m.median, digits)} ({_fmt(m.min, digits)}-{_fmt(m.max, digits)})"


def table(
    measurements: Sequence[Measurement],
    *,
    column: str | None = None,
    baseline: str | None = None,
    title: str = "",
    digits: int = 3,
) -> str:
    """A markdown table of measurements, torch.utils.benchmark.Compare's way.

    Rows are measurements (name plus every setting but ``column``); with ``column``, each value
    of that setting is a column, and with ``baseline`` (one of those values) every other column
    also gets its ratio to the baseline's median. A cell is ``median (min-max)`` over rounds.
    Below the table: the statistic, rounds and n, machine, load, commit and date, and every
    warning of ``Measurement.warnings``.
    """
    if not measurements:
        return f"{title}\n(no measurements)\n" if title else "(no measurements)\n"
    # Measurements without the column's setting (a paired ratio across its values, a total)
    # get rows of their own below, one value each, rather than an empty column of their own.
    spread = [m for m in measurements if column is not None and column in m.setting]
    single = [m for m in measurements if m not in spread]
    lines = _grid(spread, column, baseline, digits) if spread else []
    if single:
        lines += ([""] if lines else []) + _grid(single, None, None, digits)
    out = [title, ""] if title else []
    return "\n".join([*out, *lines, "", *_footer(measurements)]) + "\n"


def _grid(
    measurements: Sequence[Measurement], column: str | None, baseline: str | None, digits: int
) -> list[str]:
    row_keys = _ordered(k for m in measurements for k, _ in m.settings if k != column)
    cols = _ordered(m.setting[column] for m in measurements) if column else [""]
    if baseline is not None and baseline not in cols:
        raise ValueError(f"baseline {baseline!r} is not a value of {column!r}: {cols}")
    grid: dict[tuple[str, ...], dict[str, Measurement]] = {}
    for m in measurements:
        key = (m.name, m.unit, *(m.setting.get(k, "") for k in row_keys))
        grid.setdefault(key, {})[m.setting[column] if column else ""] = m
    others = [c for c in cols if c != baseline] if baseline is not None else []

    head = ["measurement", *row_keys, "unit"]
    head += [f"{column}={c}" for c in cols] if column else ["median (min-max)"]
    head += [f"{c} / {baseline}" for c in others]
    lines = [f"| {' | '.join(head)} |", f"|{'|'.join('---' for _ in head)}|"]
    for key, by_col in grid.items():
        cells = [*key[:1], *key[2:], key[1]]
        cells += [_cell(by_col[c], digits) if c in by_col else "" for c in cols]
        base = by_col.get(baseline) if baseline is not None else None
        for c in others:
            cells.append(_ratio(by_col.get(c), base))
        lines.append(f"| {' | '.join(cells)} |")
    return lines


def _ratio(m: Measurement | None, base: Measurement | None) -> str:
    if m is None or base is None or not base.median:
        return ""
    return f"{m.median / base.median:.2f}x"


def _ordered(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _footer(measurements: Sequence[Measurement]) -> list[str]:
    stats = _ordered(_per_round(m) for m in measurements)
    contexts = _ordered(
        f"{m.context.machine}; commit {m.context.revision}; {m.context.date}" for m in measurements
    )
    starts = [m.load_start for m in measurements if not math.isnan(m.load_start)]
    ends = [m.load_end for m in measurements if not math.isnan(m.load_end)]
    lines = [f"cells: median (min-max) over rounds; each round: {'; '.join(stats)}"]
    lines += [f"machine: {c}" for c in contexts]
    if starts and ends:
        lines.append(
            f"load average: {min(starts):.2f}-{max(starts):.2f} at start, "
            f"{min(ends):.2f}-{max(ends):.2f} at end"
        )
    unstable = [f"{m.label()} ({m.spread:.0%})" for m in measurements if m.unstable]
    if unstable:
        lines.append(
            f"WARNING rounds spread more than {UNSTABLE_SPREAD:.0%} of their mean (stdev/mean), "
            f"the result may be unstable: {', '.join(unstable)}"
        )
    busy = [m for m in measurements if m.busy]
    if busy:
        load = max(max(m.load_start, m.load_end) for m in busy)
        cores = busy[0].context.machine.cores
        lines.append(
            f"WARNING load average up to {load:.1f} on {cores} cores during {len(busy)} of "
            f"{len(measurements)} measurements: other work may have shared the CPUs"
        )
    return lines


def _per_round(m: Measurement) -> str:
    if m.statistic == PAIRED:
        return f"paired ratio, {m.rounds} pairs"
    ns = sorted(set(m.n))
    of = "" if ns == [1] else f" of n={ns[0]}" if len(ns) == 1 else f" of n={ns[0]}-{ns[-1]}"
    return f"{m.statistic}{of}, {m.rounds} rounds"
