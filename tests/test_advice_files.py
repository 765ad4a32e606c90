"""Every committed advice file regenerates from the committed tables: the command that made it
(below, one entry per file) run again prints the same text and writes the same verification
config and out-of-sample table, numbers equal to their printed precision. The bootstrap is
seeded (``--seed 0``, 200 replicates, the defaults the files were made with), so a change of the
model or of the advice that moves a committed number fails here until the file is regenerated
(docs/advisor.md, "Committed advice files"). The makespan tables regenerate from the
`codl makespan` commands of docs/advisor.md ("Makespan"), the calibration table from the command
in its script's docstring."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from codl import cli
from codl.cli import advise as advise_cli
from codl.paths import MakespanFiles

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Made:
    """``codl advise RESULTS ARGS > RESULTS/advice.txt`` (stderr too: a refused fit's line is
    the file); ``outputs``: option -> file under RESULTS it wrote. ``--details``: a committed
    advice file is a record, and keeps the model behind the advice, as the workflow's does."""

    results: str
    outputs: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ("--details",)


MADE = (
    Made(
        "results/fit-h200-light",
        (("--out", "advice/verify.yaml"), ("--cross-validate", "tables/model_cv.csv")),
    ),
    Made(
        "results/fit-h200-heavy",
        (("--out", "advice/verify.yaml"), ("--cross-validate", "tables/model_cv.csv")),
    ),
    Made("results/loop-h200", (("--cross-validate", "tables/model_cv.csv"),)),
    Made("results/loop-h200-heavy"),
    Made("results/loop-h200-jpeg"),
)
#: Verification configs that were run: the record of what the runs under them measured, kept as
#: they were (regenerating one would describe runs that never happened).
RAN = {
    "results/loop-h200/advice/verify.yaml": "results/loop-h200/verify/",
    "results/loop-h200/advice/verify-headroom.yaml": "results/loop-h200/verify-headroom/",
}

_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)")


def same_to_printed_precision(got: str, want: str) -> None:
    """The texts are equal outside numbers; each number within one unit of the last digit the
    committed file prints (a platform's last-bit difference may round the other way)."""
    g, w = _NUMBER.split(got), _NUMBER.split(want)
    assert len(g) == len(w), f"different shape:\n{got}\n---\n{want}"
    for i, (a, b) in enumerate(zip(g, w, strict=True)):
        if i % 2 == 0:
            assert a == b, f"text differs: {a!r} vs {b!r}"
            continue
        digits = len(b.split("e")[0].partition(".")[2])
        unit = 10.0**-digits * (10.0 ** int(b.split("e")[1]) if "e" in b else 1.0)
        assert abs(float(a) - float(b)) <= unit * 1.0001, f"{a} vs committed {b}"


def committed_advice_files() -> set[str]:
    found = {*REPO.glob("results/**/advice.txt"), *REPO.glob("results/**/verify*.yaml")}
    return {str(p.relative_to(REPO)) for p in found}


def test_every_committed_advice_file_is_regenerated_here() -> None:
    made = {f"{m.results}/advice/advice.txt" for m in MADE}
    made |= {f"{m.results}/{f}" for m in MADE for _, f in m.outputs if f.endswith(".yaml")}
    assert committed_advice_files() - made - set(RAN) == set()
    for config, runs in RAN.items():
        assert (REPO / runs).is_dir(), f"{config}: its runs {runs} are not committed"


@pytest.mark.parametrize("made", MADE, ids=lambda m: m.results.removeprefix("results/"))
def test_advice_file_regenerates(
    made: Made,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # From the repository root, as the files were made: they print the results dir relative.
    monkeypatch.chdir(REPO)
    argv = [made.results, *made.args]
    for option, name in made.outputs:
        argv += [option, str(tmp_path / Path(name).name)]
    rc = advise_cli.main(argv)
    out = capsys.readouterr()
    printed = out.out + out.err
    assert rc in (0, 2)
    for _, name in made.outputs:
        printed = printed.replace(str(tmp_path / Path(name).name), f"{made.results}/{name}")
    same_to_printed_precision(printed, (REPO / made.results / "advice" / "advice.txt").read_text())
    for _, name in made.outputs:
        got, want = tmp_path / Path(name).name, REPO / made.results / name
        if name.endswith(".csv"):
            pd.testing.assert_frame_equal(pd.read_csv(got), pd.read_csv(want), rtol=1e-9)
        else:
            same_to_printed_precision(got.read_text(), want.read_text())


def test_a_stale_number_is_caught() -> None:
    # The comparison must fail on the edit this test exists for: a kappa of the model before
    # its refit in an otherwise current file.
    want = "     kappa          0.8465  0.5777 to 1.577\n"
    same_to_printed_precision("     kappa          0.8466  0.5777 to 1.577\n", want)
    with pytest.raises(AssertionError):
        same_to_printed_precision("     kappa          0.9578  0.6712 to 1.589\n", want)
    with pytest.raises(AssertionError):
        same_to_printed_precision("     kappa          0.8465  0.5777 to 1.577 note\n", want)


def _makespan_commands() -> list[list[str]]:
    """The arguments of each ``codl makespan`` command of docs/advisor.md's bash blocks (the
    commands that made results/makespan-h200/), continued over backslashed lines."""
    text = (REPO / "docs" / "advisor.md").read_text().replace("\\\n", " ")
    lines = [
        x.split() for x in text.splitlines() if x.strip().startswith(".venv/bin/codl makespan")
    ]
    return [line[1:] for line in lines]


def test_committed_makespan_tables_regenerate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    commands = _makespan_commands()
    assert commands, "docs/advisor.md names no `codl makespan` command that made its outputs"
    for i, args in enumerate(commands):
        # The output directory follows the flags.
        at = next(k for k, a in enumerate(args) if k and not a.startswith("--"))
        committed, args[at] = Path(args[at]), str(tmp_path / str(i))
        assert cli.main(args) == 0
        capsys.readouterr()
        made, kept = MakespanFiles(tmp_path / str(i)), MakespanFiles(committed)
        for got_at, want_at in zip(
            (made.table, made.segments, made.rates),
            (kept.table, kept.segments, kept.rates),
            strict=True,
        ):
            got, want = pd.read_csv(got_at), pd.read_csv(want_at)
            pd.testing.assert_frame_equal(got, want, rtol=1e-3)
