"""File-level steps behind the workflow's analysis rules (read files, call pure functions, write).

The Snakemake scripts are adapters that call exactly one function of this module.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import json
import logging
import lzma
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

import pandas as pd
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]

from codl.analysis import chunked, columns, load
from codl.analysis import compare as cmp
from codl.analysis import decompose as dec
from codl.analysis import efficiency as eff
from codl.analysis import summarize as sm
from codl.analysis.load import flag_comparison
from codl.analysis.steady import flag_outliers
from codl.errors import CodlError
from codl.figures import RUN_FIGURES, run_tables
from codl.outputs import manifest_of, output_unit, verify_member, verify_unit
from codl.paths import FIGURE_FORMATS, compare_manifest, summarize_manifest
from codl.trace.clock import rank_bounds
from codl.trace.schema import Table
from codl.trace.store import open_trace

if TYPE_CHECKING:
    from codl.figures.registry import FigureInputs

log = logging.getLogger(__name__)


def _wrote(df: pd.DataFrame, out: Path) -> None:
    log.info("wrote %s (%d rows x %d columns)", out, len(df), df.shape[1])


def summarize_to(
    trace: Path,
    *,
    steps: Path,
    summary: Path,
    attribution: Path,
    parts: Path,
    api_calls: Path | None = None,
    timeline: Path | None = None,
    manifest: Path | None = None,
) -> pd.DataFrame:
    """Every per-run table of one trace, and its figure tables when their paths are given;
    returns the one-row summary.

    The tables are written as one unit (``codl.outputs``) with the manifest
    ``manifest`` (default: ``paths.summarize_manifest(summary)``): they appear together or not
    at all, never over the trace, and readers (:func:`compare_to`) check them against it.
    """
    if (api_calls is None) != (timeline is None):
        raise ValueError("summarize_to: api_calls and timeline go together (both or neither)")
    log.info("reading %s", trace)
    # The big event tables in the rows and columns the tables below use, read block by block
    # (decoded on the job's cores): never the whole of a long run's loader or CUDA table.
    tables, attrs, api, loader = chunked.read_summary(
        trace, threads=chunked.default_threads(), warmup_rows=True
    )
    log.info(
        "run %s: %s",
        attrs.get("run_id", "?"),
        ", ".join(f"{name} {len(df)} rows" for name, df in tables.items() if len(df)),
    )
    run_id = str(attrs.get("run_id", ""))
    # The scheduler samples' per-step differences, which the decomposition and the summary
    # both use: made once.
    deltas = sm.sched_deltas(tables[Table.SCHED])
    chunked.release_free_heap()  # the differences' temporaries, before the next make theirs
    figure_tables = [api_calls, timeline] if api_calls is not None and timeline is not None else []
    # The step timeline's step picked now, so that the samples themselves can be cut to the
    # rows still read: the share of the cores' time outside the run, and that step's waits.
    picked = _timeline_step(trace, tables, attrs) if figure_tables else None
    tables[Table.SCHED] = _sched_still_read(tables, attrs, None if picked is None else picked[0])
    pt = _step_parts(tables, attrs, deltas, run_id)
    with output_unit(
        [steps, summary, attribution, parts, *figure_tables],
        inputs=(trace,),
        manifest=manifest or summarize_manifest(summary),
        run_id=run_id,
        mkdir=True,
    ) as unit:
        # The attribution is written piece by piece as it is made (~10^7 rows per 10^9
        # events), never held whole.
        with _ParquetPieces(unit.path(attribution)) as at:
            st, sm_ = sm.summarize_stream(
                tables,
                attrs,
                attribution=at.write,
                parts=pt,
                api=api,
                loader=loader,
                deltas=deltas,
            )
            del deltas
            at.finish(sm.empty_attribution(run_id))
        chunked.release_free_heap()
        for df, out in ((st, steps), (sm_, summary), (pt, parts)):
            df.to_parquet(unit.path(out), index=False)
            _wrote(df, out)
        log.info("wrote %s (%d rows in %d pieces)", attribution, at.rows, at.pieces)
        if api_calls is not None and timeline is not None and picked is not None:
            written = _write_figure_tables(
                tables, attrs, api, (unit.path(api_calls), unit.path(timeline)), picked
            )
            # Logged by their final names: the unit renames them there together.
            for df, out in zip(written, (api_calls, timeline), strict=True):
                _wrote(df, out)
    return sm_


# The per-call table's columns (``write_calls``): the runtime rows of events/cuda less their
# kind (every row's is "runtime") and stream (a call has none), and whether the call falls in
# the warm-up steps, which the summary leaves out.
CALL_COLUMNS = ("rank", "step", "name", "tid", "correlation", "start_ns", "end_ns", "warmup")
_CALLS_ROWS: Final = 1 << 18  # rows a block and row group
# Dictionaries for the few-valued columns, deltas for the counters and times (they mostly
# rise): 72 M calls of a 10^8-event trace in 12.3 s and 394 MB, against 17.7 s and
# 1.13 GB with every column in a dictionary and 23.2 s with pyarrow's defaults (2-core
# machine, one round each); the writer's one thread is what bounds it.
_CALLS_PARQUET: Final[dict[str, Any]] = {
    "use_dictionary": ["name", "rank", "step", "tid"],
    "column_encoding": {c: "DELTA_BINARY_PACKED" for c in ("correlation", "start_ns", "end_ns")},
}


def write_calls(trace: Path, out: Path) -> int:
    """Every CUDA runtime API call of ``trace`` as one Parquet table at ``out``, columns
    ``CALL_COLUMNS``, in the trace's order; returns its rows. What a user asks for where the
    per-name latency buckets of api_calls.parquet are not enough: it grows with the calls
    (~7 x 10^7 rows per 10^8-event trace), so no table of the summary is made of it.

    Read and written block by block (a row group per block of the trace, the names
    dictionary-encoded over the trace's string table), so memory does not grow with the
    calls. events/cuda is verified as it is read (``Trace.verified_blocks``) and the file is
    a unit of its own (``codl.outputs``): it appears whole, after its table passed its check,
    or not at all; a trace without events/cuda gives the table with no rows."""
    schema = pa.schema(
        [
            ("rank", pa.int16()),
            ("step", pa.int32()),
            ("name", pa.dictionary(pa.int32(), pa.string())),
            ("tid", pa.int64()),
            ("correlation", pa.int64()),
            ("start_ns", pa.int64()),
            ("end_ns", pa.int64()),
            ("warmup", pa.bool_()),
        ]
    )
    rows = 0
    with (
        open_trace(trace) as t,
        output_unit({"calls table": out}, inputs=(trace,), mkdir=True) as unit,
        pq.ParquetWriter(unit.path(out), schema, **_CALLS_PARQUET) as writer,
        # Left before the writer: its last write ends before the file is closed.
        ThreadPoolExecutor(1, thread_name_prefix="codl-parquet") as writing,
        ThreadPoolExecutor(chunked.default_threads()) as pool,
    ):
        t.verify_structure()
        warmup = columns.warmup_steps(dict(t.attrs))
        names = pa.array(t.strings, pa.string())
        runtime = t.strings.index("runtime") if "runtime" in t.strings else None
        behind = chunked.OneBehind(writing)
        if Table.CUDA in t.tables() and runtime is not None:
            # Fresh arrays per block (no reuse): the writer's thread holds a block's columns
            # while the next one is read. 2^18-row blocks: 256 MiB peak RSS at 10^8 events,
            # 446 MiB in the reader's default 1 Mi, in the same time (12.5-12.8 s).
            for _, _, block in t.verified_blocks(Table.CUDA, pool=pool, rows=_CALLS_ROWS):
                is_call = block["kind"] == runtime
                calls = block if is_call.all() else {c: v[is_call] for c, v in block.items()}
                if not len(calls["step"]):
                    continue
                arrays = [
                    pa.array(calls["rank"]),
                    pa.array(calls["step"]),
                    pa.DictionaryArray.from_arrays(pa.array(calls["name"]), names),
                    *(pa.array(calls[c]) for c in ("tid", "correlation", "start_ns", "end_ns")),
                    pa.array(calls["step"] < warmup),
                ]
                behind.submit(writer.write_table, pa.Table.from_arrays(arrays, schema=schema))
                rows += len(calls["step"])
        behind.wait()
    log.info("wrote %s (%d calls)", out, rows)
    return rows


def _step_parts(
    tables: dict[str, pd.DataFrame], attrs: dict[str, Any], deltas: pd.DataFrame, run_id: str
) -> pd.DataFrame:
    """The run's decomposition inputs (``decompose.step_parts``) with its ``run_id``."""
    # Each phase's freed temporaries handed back before the next: peak RSS, not their sum.
    chunked.release_free_heap()
    pt = dec.step_parts(
        tables,
        warmup=columns.warmup_steps(attrs),
        ranks_per_node=sm.ranks_per_node(attrs),
        clock_bound_ns=rank_bounds(attrs),
        deltas=deltas,
    )
    pt.insert(0, "run_id", run_id)
    chunked.release_free_heap()
    return pt


class _ParquetPieces:
    """A Parquet file written from DataFrames of one schema, one after another (a row group or
    more each): what ``DataFrame.to_parquet`` of them joined writes, read back, without the
    join. Each piece is encoded and written on a thread while the caller makes the next
    (Arrow lets go of the GIL), at most one piece behind. ``finish(empty)`` writes ``empty``
    where no piece came; the file is closed when the ``with`` block ends, after its last
    piece, and a piece's failed write is raised by the next ``write`` or by the close."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._writer: pq.ParquetWriter | None = None
        self._schema: pa.Schema | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="codl-parquet")
        self._writing = chunked.OneBehind(self._thread)
        self.rows = self.pieces = 0

    def __enter__(self) -> _ParquetPieces:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        try:
            self._writing.wait()
        except Exception:
            if exc_type is None:  # else the caller's own error is the one to see
                raise
        finally:
            self._thread.shutdown()
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def write(self, df: pd.DataFrame) -> None:
        table = pa.Table.from_pandas(df, schema=self._schema, preserve_index=False)
        if self._writer is None:
            self._schema = table.schema
            self._writer = pq.ParquetWriter(self._path, self._schema)
        self._writing.submit(self._writer.write_table, table)
        self.rows += len(df)
        self.pieces += 1

    def finish(self, empty: pd.DataFrame) -> None:
        if self._writer is None:
            empty.to_parquet(self._path, index=False)


def _sched_still_read(
    tables: dict[str, pd.DataFrame], attrs: dict[str, Any], step: int | None
) -> pd.DataFrame:
    """The scheduler samples that are read once their per-step differences are made: those
    of ``load.outside_cpu_share`` and, where ``step`` is given, the step timeline's (rank 0's
    samples of ``step`` and their predecessors). A long run's whole table is ~0.3 GiB per
    10^9 events, held to the end for these few rows."""
    sched = tables[Table.SCHED]
    keep = load.sched_sample_rows(
        tables[Table.CPU],
        sched,
        tables[Table.THREADS],
        attrs,
        warmup=columns.warmup_steps(attrs),
        ranks_per_node=sm.ranks_per_node(attrs),
    )
    if step is not None:
        keep |= sm.step_sample_rows(sched, rank=0, step=step)
    return sched[keep].reset_index(drop=True)


def _write_figure_tables(
    tables: dict[str, pd.DataFrame],
    attrs: dict[str, Any],
    api: Any,
    outs: tuple[Path, Path],
    picked: tuple[int | None, str],
) -> list[pd.DataFrame]:
    """The two figure tables of one run (api_calls, timeline of the step ``picked``: its step
    and how it was picked, as ``_timeline_step`` gives them) written to ``outs``."""
    spec = attrs.get("spec", {})
    spec = json.loads(spec) if isinstance(spec, str) else spec
    step, pick = picked
    written = run_tables.write_run_tables(
        tables,
        attrs,
        spec,
        api_calls_out=outs[0],
        timeline_out=outs[1],
        api=api,
        step=step,
        pick=pick,
    )
    return [written[outs[0]], written[outs[1]]]


def _timeline_step(
    trace: Path, tables: dict[str, pd.DataFrame], attrs: dict[str, Any]
) -> tuple[int | None, str]:
    """The step the step timeline shows and how it was picked (``run_tables.MEDIAN`` ...), with
    its loader rows put in ``tables``: read by time window, step by step from the one closest
    to the median step time, until rank 0 has a loader row in it (at most
    ``run_tables.LOADER_CANDIDATES`` windows, each reading only the chunks it overlaps)."""
    steps = run_tables.timeline_steps(tables, attrs)
    if not steps:
        return None, run_tables.MEDIAN
    with open_trace(trace) as t:
        if Table.LOADER not in t.tables():
            return steps[0][0], run_tables.MEDIAN
        first = None
        for i, (step, t0, t1) in enumerate(steps[: run_tables.LOADER_CANDIDATES]):
            rows = t.table(Table.LOADER, t0=t0, t1=t1)
            first = rows if first is None else first
            if (rows["rank"] == 0).any():
                tables[Table.LOADER] = rows
                return step, run_tables.MEDIAN if i == 0 else run_tables.WITH_LOADER
    if first is not None:
        tables[Table.LOADER] = first
    return steps[0][0], run_tables.NO_LOADER


def _read_all(
    paths: Sequence[Path], kind: str, checked: dict[Path, dict[str, Any]] | None = None
) -> pd.DataFrame:
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise CodlError(f"missing {kind} files (their runs did not finish): {missing}")
    checked = {} if checked is None else checked
    frames = [_read_member(Path(p), checked) for p in paths]
    frames = [f for f in frames if len(f)]
    merged = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    log.info(
        "read %d %s file(s), %d with rows: %d rows", len(paths), kind, len(frames), len(merged)
    )
    return merged


def _read_member(path: Path, checked: dict[Path, dict[str, Any]]) -> pd.DataFrame:
    """A per-run table, once its unit is whole (``outputs.verify_member``; each unit once per
    command, in ``checked``) and holds only its run's rows."""
    run_id = verify_member(path, checked=checked)
    df = pd.read_parquet(path)
    if run_id and "run_id" in df and len(df) and set(df["run_id"].astype(str)) != {run_id}:
        raise CodlError(f"{path}: rows of runs {sorted(set(df['run_id']))}, its unit is {run_id}")
    return df


def compare_to(
    *,
    summaries: Sequence[Path],
    steps: Sequence[Path],
    attributions: Sequence[Path],
    parts: Sequence[Path],
    runs_table: Path,
    steps_table: Path,
    comparison_table: Path,
    attribution_table: Path,
    decomposition_table: Path,
    manifest: Path | None = None,
) -> pd.DataFrame:
    """The merged tables of every run's summarize unit, and their comparison and decomposition.

    The five tables are written as one unit (``codl.outputs``) with the manifest ``manifest``
    (default: ``paths.compare_manifest(runs_table)``, in their one directory): they appear
    together or not at all, never over a per-run table, and their readers (figures, advise)
    check them against it.
    """
    inputs = [*summaries, *steps, *attributions, *parts]
    units: dict[Path, dict[str, Any]] = {}  # a run's four tables are one unit, checked once
    summary = _read_all(summaries, "summary", units)
    step_df = _read_all(steps, "steps", units)
    part_df = _read_all(parts, "parts", units)
    comparison = flag_comparison(cmp.compare(step_df, summary), summary)
    decomposition = dec.decompose(step_df, part_df, summary)
    # The runs table names each run's twins of its own block and its pipeline efficiency;
    # the comparison carries the efficiency of each row's group over blocks.
    runs = eff.with_run_efficiency(summary, decomposition)
    comparison = eff.with_group_efficiency(comparison, runs)
    tables = {
        runs_table: runs,
        steps_table: step_df,
        comparison_table: comparison,
        decomposition_table: decomposition,
    }
    with output_unit(
        [*tables, attribution_table],
        inputs=[Path(p) for p in inputs],
        manifest=manifest or compare_manifest(runs_table),
        mkdir=True,
    ) as unit:
        for out, df in tables.items():
            # The final name's suffix (.csv.gz) picks the compression; the unit keeps names.
            df.to_csv(unit.path(out), index=False)
        # Rows per (run, rank, step, thread): ~10^6 per 10^8-event run, copied run by run.
        attributed = _copy_csv(attributions, "attribution", units, unit.path(attribution_table))
    for out, df in tables.items():
        _wrote(df, out)
    log.info("wrote %s (%d rows)", attribution_table, attributed)
    return comparison


# Rows a batch of ``_copy_csv``: a batch's pandas frame and its CSV text are what it holds.
_COPY_ROWS: Final = 1 << 16
# Compressions a table copied batch by batch can be written with, by the name's last suffix
# (one stream through one handle: pandas would start a new member, or archive, per batch).
_TEXT_OPENERS: Final[dict[str, Callable[..., IO[str]]]] = {
    ".gz": gzip.open,
    ".bz2": bz2.open,
    ".xz": lzma.open,
}
# What pandas would write as an archive or with a codec the standard library lacks.
_ARCHIVES: Final = (".zip", ".zst", ".tar", ".tgz", ".tbz", ".tbz2", ".txz")


def _schema_change(was: pa.Schema, now: pa.Schema) -> str:
    """How ``now``'s columns differ from ``was``'s, column by column."""
    old = {f.name: str(f.type) for f in was}
    new = {f.name: str(f.type) for f in now}
    said = [f"no {c}" for c in old if c not in new]
    said += [f"{c} too" for c in new if c not in old]
    said += [f"{c} {new[c]}, not {t}" for c, t in old.items() if c in new and new[c] != t]
    return "; ".join(said) or "the same columns in another order"


def _copy_csv(
    paths: Sequence[Path], kind: str, checked: dict[Path, dict[str, Any]], out: Path
) -> int:
    """The per-run ``kind`` tables ``paths`` joined as :func:`_read_all` joins them, written to
    ``out`` as CSV (``DataFrame.to_csv`` of the join) a row batch at a time, never joined;
    returns the rows. Files of no rows are left out, as the join leaves them; the others must
    have the same columns and types, which the join would otherwise have to reconcile. The
    text is the join's where a column's format does not hang on its other rows, as in the
    attribution (no nullable integers, no timestamps: pandas writes an int column with a null
    as floats, and a timestamp column's precision by its values, column-wide)."""
    missing = [str(p) for p in paths if not Path(p).exists()]
    if missing:
        raise CodlError(f"missing {kind} files (their runs did not finish): {missing}")
    suffix = out.suffix.lower()
    if suffix in _ARCHIVES or ".tar" in (s.lower() for s in out.suffixes):
        raise CodlError(
            f"{out}: a merged {kind} table is compressed as {', '.join(_TEXT_OPENERS)} or not "
            f"at all; got {''.join(out.suffixes)!r}"
        )
    opener = _TEXT_OPENERS.get(suffix, open)
    rows = 0
    header = True
    first: tuple[Path, pa.Schema] | None = None
    with opener(out, "wt", newline="", encoding="utf-8") as handle:  # as to_csv, any locale
        for path in map(Path, paths):
            run_id = verify_member(path, checked=checked)
            parquet = pq.ParquetFile(path)
            if not parquet.metadata.num_rows:
                continue
            schema = parquet.schema_arrow.remove_metadata()
            if first is None:
                first = (path, schema)
            elif not schema.equals(first[1]):
                raise CodlError(
                    f"{path}: its {kind} columns differ from those of {first[0]} "
                    f"({_schema_change(first[1], schema)}): made by another CoDL version? "
                    f"Summarize both runs again"
                )
            for batch in parquet.iter_batches(batch_size=_COPY_ROWS):
                df = batch.to_pandas()
                if run_id and "run_id" in df and set(df["run_id"].astype(str)) != {run_id}:
                    raise CodlError(
                        f"{path}: rows of runs {sorted(set(df['run_id']))}, its unit is {run_id}"
                    )
                if len(df):
                    df.to_csv(handle, index=False, header=header)
                    header = False
                    rows += len(df)
        if header:  # the join of no rows: no columns either
            pd.DataFrame().to_csv(handle, index=False)
    log.info("read %d %s file(s): %d rows", len(paths), kind, rows)
    return rows


def _read_csv(path: Path, checked: dict[Path, dict[str, Any]] | None = None) -> pd.DataFrame:
    """A merged table, once its unit (compare's) is whole; tables written before units, or
    beside no manifest, are read as they are."""
    verify_member(path, checked=checked)
    # Whole-file type inference: read in pieces, a column that is empty in the first rows
    # (outlier_reason of the steps table) is guessed once per piece and comes back mixed.
    df = pd.read_csv(path, low_memory=False)
    log.info("read %s (%d rows)", path, len(df))
    return df


def recompare_tables(
    *, runs_table: Path, steps_table: Path, comparison_table: Path, decomposition_table: Path
) -> pd.DataFrame:
    """Comparison and decomposition again from merged runs/steps tables alone (no traces).

    For result sets whose traces are not at hand (results/h200/): steps are flagged here when
    their table predates the flags, and the decomposition gets only what a steps table holds
    (``decompose.parts_from_steps``: the main thread's schedstat, not autograd, buckets or
    kernels).
    """
    # Ids are hex strings; one of only digits must not be read as a number (and lose its zeros).
    ids = dict.fromkeys(("run_id", cmp.GROUP_ID, *cmp.TWIN_COLUMNS, *cmp.TWIN_GROUP_COLUMNS), str)
    # Of compare's unit only what this reads must be whole: the rest is what it rewrites.
    manifest = manifest_of(comparison_table)
    doc: dict[str, Any] = {}
    if manifest is not None:
        doc = verify_unit(manifest, only=[runs_table.name, steps_table.name])
    summary = pd.read_csv(runs_table, dtype=ids)
    steps = pd.read_csv(steps_table, dtype={"run_id": str})
    new: dict[Path, pd.DataFrame] = {}
    if "outlier" not in steps:
        steps = flag_outliers(steps)
        new[steps_table] = steps
    comparison = flag_comparison(cmp.compare(steps, summary), summary)
    decomposition = dec.decompose(steps, dec.parts_from_steps(steps), summary)
    # The runs table is not rewritten here: its efficiency is computed for the comparison only.
    runs = eff.with_run_efficiency(summary, decomposition)
    comparison = eff.with_group_efficiency(comparison, runs)
    new[comparison_table] = comparison
    new[decomposition_table] = decomposition
    # Tables of compare's unit are rewritten as that unit: every member again (the unchanged
    # ones copied), under its manifest; tables written before units, as a unit of their own.
    members = [comparison_table.parent / name for name in doc.get("members", {})]
    outputs = list(dict.fromkeys([*new, *members]))
    with output_unit(outputs, manifest=manifest, run_id=str(doc.get("run_id", ""))) as unit:
        for out in outputs:
            if out in new:
                # gzip without a time stamp: a table rebuilt unchanged is the same bytes.
                gz = {"method": "gzip", "mtime": 0} if out.suffix == ".gz" else None
                new[out].to_csv(unit.path(out), index=False, compression=gz)
            else:
                shutil.copyfile(out, unit.path(out))
    return comparison


def merged_inputs(
    *, runs_table: Path, steps_table: Path, comparison_table: Path, decomposition_table: Path
) -> FigureInputs:
    """The merged tables as figure inputs (no per-run tables), checked as one unit."""
    from codl.figures.registry import FigureInputs  # matplotlib: only where figures are drawn

    units: dict[Path, dict[str, Any]] = {}
    return FigureInputs(
        runs=_read_csv(runs_table, units),
        steps=_read_csv(steps_table, units),
        comparison=_read_csv(comparison_table, units),
        decomposition=_read_csv(decomposition_table, units),
    )


def draw_figures(inputs: FigureInputs, figdir: Path, *, merged_only: bool = False) -> None:
    """Every run figure (only those the merged tables suffice for, if ``merged_only``)."""
    # Imported here: matplotlib costs ~0.5 s, which `codl summarize` never needs.
    from codl.figures.registry import FIGURES, draw_figure

    for fig in FIGURES:
        if fig.name not in RUN_FIGURES or (merged_only and not fig.merged_only):
            continue
        draw_figure(fig.name, inputs, [figdir / f"{fig.name}.{fmt}" for fmt in FIGURE_FORMATS])


def table_figures_to(
    *,
    runs_table: Path,
    steps_table: Path,
    comparison_table: Path,
    decomposition_table: Path,
    figdir: Path,
) -> None:
    """The figures drawn from the merged tables alone."""
    inputs = merged_inputs(
        runs_table=runs_table,
        steps_table=steps_table,
        comparison_table=comparison_table,
        decomposition_table=decomposition_table,
    )
    draw_figures(inputs, figdir, merged_only=True)


def figures_to(
    *,
    runs_table: Path,
    steps_table: Path,
    comparison_table: Path,
    decomposition_table: Path,
    api_calls: Sequence[Path],
    timelines: Sequence[Path],
    figdir: Path,
) -> None:
    """Every figure, from the merged tables and the runs' figure tables (never the traces)."""
    merged = merged_inputs(
        runs_table=runs_table,
        steps_table=steps_table,
        comparison_table=comparison_table,
        decomposition_table=decomposition_table,
    )
    units: dict[Path, dict[str, Any]] = {}
    inputs = dataclasses.replace(
        merged,
        api_calls=_read_all(api_calls, "api_calls", units),
        timelines=_read_all(timelines, "timeline", units),
    )
    draw_figures(inputs, figdir)
