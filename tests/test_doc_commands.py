"""Every command the README and docs/ show in a ```bash block runs, as written, from a fresh shell.

The commands are extracted from the pages themselves, so a changed page cannot drift from its
test: a new command that no entry of ``WAYS`` covers fails ``test_every_documented_command_has_
a_way_to_run``, and each command runs in a copy of this checkout (its own ``results/``, the
venv linked in) from a shell whose PATH has no venv, as a user types it after cloning.

A command is run one of these ways (``How``):
- as written;
- as written plus ``--dry-run``: the GPU matrix and the Slurm submission, which a CPU machine
  without a cluster can plan but not run (the real Slurm runs are tests/slurm/'s);
- not here, because it is what CI itself runs (``make test``) or a measurement record whose
  re-run takes the node minutes to hours (docs/performance.md: the benchmarks' own tests run them
  small).
"""

from __future__ import annotations

import enum
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from shellenv import without_venv

REPO = Path(__file__).resolve().parents[1]
PAGES = (
    REPO / "README.md",
    REPO / "config" / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "examples").glob("*/README.md")),
)
SHELLS = {"bash", "sh", "shell", "console"}


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def commands_of(page: Path, root: Path = REPO) -> list[Command]:
    """The commands of a page's shell blocks: continuation lines joined, comments and a
    console's ``$`` prompt dropped, output lines of a console block skipped."""
    out: list[Command] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    rel = str(page.relative_to(root))
    lang: str | None = None
    pending: tuple[int, str] | None = None
    for n, raw in enumerate(lines, 1):
        fence = re.match(r"^```(\w*)\s*$", raw)
        if fence:
            lang = None if lang is not None else fence.group(1)
            continue
        if lang not in SHELLS:
            continue
        line = raw.rstrip()
        if lang == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if pending is None:
            line = re.sub(r"\s+#.*$", "", line) if not line.lstrip().startswith("#") else ""
            if not line.strip():
                continue
            pending = (n, line)
        else:
            pending = (pending[0], pending[1] + " " + line.strip())
        if pending[1].endswith("\\"):
            pending = (pending[0], pending[1][:-1].rstrip())
            continue
        out.append(Command(rel, pending[0], pending[1].strip()))
        pending = None
    return out


def documented_commands() -> list[Command]:
    return [c for page in PAGES for c in commands_of(page)]


class How(enum.Enum):
    AS_WRITTEN = "as written"
    DRY_RUN = "as written plus --dry-run"
    CI = "what CI runs: make test"
    RECORD = "a measurement record (docs/performance.md)"


@dataclass(frozen=True)
class Way:
    pattern: str  # matches the whole command
    how: How
    why: str

    def matches(self, cmd: Command) -> bool:
        return re.fullmatch(self.pattern, cmd.text) is not None


BENCH = r"(PYTHONPATH=src \.venv/bin/python|\.venv/bin/python|python3) (benchmarks/)?\w+\.py.*"
WAYS: tuple[Way, ...] = (
    Way(r"make demo( TORCH=cpu)?", How.AS_WRITTEN, "the demo; TORCH only chooses the venv's build"),
    Way(r"make demo-advise", How.AS_WRITTEN, "the advisor's CPU loop and `codl advise`"),
    Way(r"make test", How.CI, "CI's own command (.ci/run)"),
    Way(r"\.venv/bin/codl plan \S+\.yaml", How.AS_WRITTEN, "checks a config"),
    Way(
        r"\.venv/bin/codl plan \S+\.yaml --(freeze|status)",
        How.AS_WRITTEN,
        "fixes a plan before its runs, says whether a result was (docs/preregistration.md)",
    ),
    Way(r"\.venv/bin/codl levels .*", How.AS_WRITTEN, "invocations as a level, committed tables"),
    Way(
        r"\.venv/bin/snakemake --profile profiles/local --configfile config/config\.yaml",
        How.DRY_RUN,
        "the GPU matrix: a CPU machine plans it",
    ),
    Way(
        r"export CODL_SLURM_PARTITION=\S+ CODL_SLURM_ACCOUNT=\S+",
        How.AS_WRITTEN,
        "the Slurm submission's environment",
    ),
    Way(
        r"\.venv/bin/snakemake --profile profiles/slurm --configfile config/config\.yaml",
        How.DRY_RUN,
        "the Slurm submission: planned here; tests/slurm/ submits real jobs",
    ),
    Way(r"\.venv/bin/pip install \./examples/\S+", How.AS_WRITTEN, "your own workload"),
    Way(
        r"\.venv/bin/snakemake --profile profiles/local --configfile examples/\S+\.yaml",
        How.AS_WRITTEN,
        "your own workload through the workflow",
    ),
    Way(r"\.venv/bin/codl (inspect|export|convert) .*", How.AS_WRITTEN, "looking at one run"),
    Way(r"\.venv/bin/codl advise .*", How.AS_WRITTEN, "the advisor on a committed result set"),
    Way(
        r"\.venv/bin/codl makespan .*",
        How.AS_WRITTEN,
        "the committed makespan tables, made again from the committed result sets",
    ),
    Way(r"gunzip -c tests/golden/traces/\S+ > \S+", How.AS_WRITTEN, "a test trace to try on"),
    Way(r"export HDF5_PLUGIN_PATH=.*", How.AS_WRITTEN, "reading a trace without codl"),
    Way(r"h5dump .*", How.AS_WRITTEN, "reading a trace without codl"),
    Way(BENCH, How.RECORD, "re-measures (minutes to hours; some on a GPU node)"),
    Way(
        r"python examples/plain-loop/train\.py .*--device cuda.*",
        How.RECORD,
        "a GPU node's runs of the plain loop (benchmarks/plain_loop.py makes the record)",
    ),
    Way(
        r"\.venv/bin/python examples/plain-loop/train\.py .*--device cpu.*",
        How.AS_WRITTEN,
        "the plain loop with codl's loader, on the CPU",
    ),
)


def way_of(cmd: Command) -> Way:
    found = [w for w in WAYS if w.matches(cmd)]
    if len(found) != 1:
        raise LookupError(f"{cmd}: {len(found)} ways to run it (want 1): {found}")
    return found[0]


def test_every_documented_command_has_a_way_to_run() -> None:
    commands = documented_commands()
    assert len(commands) > 20, commands  # the pages hold commands: the parser found them
    unknown = []
    for cmd in commands:
        try:
            way_of(cmd)
        except LookupError as exc:
            unknown.append(str(exc))
    assert not unknown, "\n".join(unknown)
    # Every way is still used: a page that drops a command drops its way too.
    unused = [w.pattern for w in WAYS if not any(w.matches(c) for c in commands)]
    assert not unused, unused


def test_the_parser_reads_blocks_continuations_and_prompts(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text `make demo` inline is not a command\n"
        "```bash\n# a comment\nmake demo   # trailing\ncodl advise r \\\n    --boot 0\n```\n"
        "```\nnot a shell block\n```\n"
        "```console\n$ codl inspect t.h5\noutput line\n```\n"
    )
    got = [(c.line, c.text) for c in commands_of(page, tmp_path)]
    assert got == [(4, "make demo"), (5, "codl advise r --boot 0"), (12, "codl inspect t.h5")]


def test_an_undocumented_way_is_reported() -> None:
    with pytest.raises(LookupError, match="0 ways"):
        way_of(Command("x.md", 1, "rm -rf results"))


# --------------------------------------------------------------------------- running them


def _copy_of_checkout(dest: Path) -> Path:
    """This checkout's tracked and unignored files (mtimes kept), the venv linked in."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for rel in filter(None, listed):
        src = REPO / os.fsdecode(rel)
        if not src.is_file():  # deleted in the work tree
            continue
        target = dest / os.fsdecode(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    (dest / ".venv").symlink_to(Path(sys.executable).parents[1])
    return dest


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    venv = Path(sys.executable).parents[1]
    if not (venv / ".installed").is_file():
        pytest.skip("runs the documented commands with the Makefile's venv (make venv)")
    root = _copy_of_checkout(tmp_path_factory.mktemp("docs") / "codl checkout")
    # The venv's stamp must be newer than what it was built from, or `make` would rebuild it
    # through the link.
    stale = subprocess.run(["make", "-q", ".venv/.installed"], cwd=root, check=False)
    if stale.returncode != 0:
        pytest.fail("the venv is older than pyproject.toml or constraints.txt: run `make venv`")
    yield root


def _shell(root: Path, script: str, *, timeout: int = 1500) -> subprocess.CompletedProcess[str]:
    env = without_venv()
    # `pip install ./examples/...` as written, into a directory of this test instead of the
    # venv that the rest of the suite uses (pip reads PIP_TARGET); the workflow finds it there.
    site = root / ".site"
    env.update({"PIP_TARGET": str(site), "PYTHONPATH": str(site)})
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _run_id(root: Path) -> str:
    runs = pd.read_csv(root / "results" / "smoke" / "tables" / "runs.csv")
    return str(runs.loc[runs["mode"] == "combined", "run_id"].iloc[0])


def _script(cmds: list[Command], root: Path) -> str:
    lines = []
    for cmd in cmds:
        text = cmd.text.replace("<run_id>", _run_id(root)) if "<run_id>" in cmd.text else cmd.text
        if way_of(cmd).how is How.DRY_RUN:
            text += " --dry-run"
        lines.append(f"echo '>>> {cmd.page}:{cmd.line}'; {text}")
    return "\n".join(lines)


def _blocks() -> list[list[Command]]:
    """The commands to run, grouped by page in page order; a page's commands share a shell
    (an `export` line holds for the lines after it)."""
    by_page: dict[str, list[Command]] = {}
    for cmd in documented_commands():
        if way_of(cmd).how in (How.AS_WRITTEN, How.DRY_RUN):
            by_page.setdefault(cmd.page, []).append(cmd)
    return list(by_page.values())


@pytest.mark.slow
def test_every_documented_command_runs_as_written(checkout: Path) -> None:
    # The demo first: the other pages look at its runs.
    blocks = sorted(_blocks(), key=lambda b: b[0].page != "README.md")
    failed, wrote = [], {}
    for block in blocks:
        before = {p.name for p in checkout.iterdir()}
        proc = _shell(checkout, _script(block, checkout))
        if proc.returncode != 0:
            failed.append(
                f"{block[0].page}: exit {proc.returncode}\n{proc.stdout[-3000:]}"
                f"\n{proc.stderr[-3000:]}"
            )
        # What a page wrote beside the checkout (an export, a converted trace) is its own: a
        # reader of the next page starts without it, and its output name may be the same.
        new = [p for p in checkout.iterdir() if p.name not in before and p.is_file()]
        wrote[block[0].page] = {p.name: p.stat().st_size for p in new}
        for p in new:
            p.unlink()
    assert not failed, "\n\n".join(failed)
    # What they made, where the docs say.
    smoke = checkout / "results" / "smoke"
    assert (smoke / "report.html").stat().st_size > 10_000
    assert (smoke / "tables" / "blocks.csv").is_file()
    assert (checkout / "results" / "loop-cpu" / "advice" / "advice.txt").is_file()
    assert (checkout / "results" / "config" / "tables" / "runs.csv").is_file()  # the example's
    assert set(wrote["docs/outputs.md"]) == {"run.json", "trace-gzip.h5"}
    assert all(size > 0 for page in wrote.values() for size in page.values()), wrote
