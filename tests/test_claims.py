"""The README's and the results pages' numbers are the claims registry's (docs/claims.yaml),
recomputed from the committed tables; a changed table names the stale sentence."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from codl.claims.check import check, render_all
from codl.claims.compute import evaluate, select
from codl.claims.registry import (
    REGISTRY,
    Claim,
    Format,
    Value,
    claim_from_dict,
    load_registry,
    render,
)
from codl.claims.text import CATALOGUE, citations, pages_of
from codl.errors import CodlError

REPO = Path(__file__).resolve().parents[1]


def test_every_citation_and_the_catalogue_match_the_committed_tables() -> None:
    assert check(REPO) == []


def test_every_claim_names_its_statistic_counts_and_a_committed_source() -> None:
    for claim in load_registry(REPO / REGISTRY):
        assert claim.statistic.strip(), claim.id
        assert all(str(s).startswith("results/") for s in claim.sources), claim.id
        v = evaluate(claim, REPO)
        assert math.isfinite(v.value), claim.id
        assert v.n_blocks is not None and v.n_invocations is not None, claim.id


def test_the_readme_findings_cite_only_claims() -> None:
    """Every measured number in the README's findings sits inside a claim marker: the setting
    ("12 workers") stays text, and so do the published paper's numbers, which no table of ours
    holds."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("## What it found")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    cited = [c for c in citations(REPO / "README.md") if start < c.line <= end]
    assert len({c.claim for c in cited}) >= 10
    for n, line in enumerate(lines[start + 1 : end], start + 2):
        bare = re.sub(r"<!-- claim:.*?<!-- /claim -->", "", line)
        bare = re.sub(r"\([^()]*\.md[^()]*\)", "", bare)  # link targets
        bare = re.sub(r"paper: [^;)]*", "", bare)
        assert not re.search(r"[+-]\d+(\.\d+)? %|\[[+-]?\d", bare), f"README.md:{n}: {bare}"


def _copy(root: Path, rel: str | Path) -> Path:
    dest = root / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO / rel, dest)
    return dest


def _checkout_with(tmp_path: Path, claim_id: str) -> tuple[Path, Claim]:
    """A checkout holding the registry, the pages and every claim's source tables."""
    root = tmp_path / "checkout with spaces ü"
    claims = load_registry(REPO / REGISTRY)
    _copy(root, REGISTRY)
    for page in pages_of(REPO):
        _copy(root, page.relative_to(REPO))
    for c in claims:
        for s in c.sources:
            if not (root / s).exists():
                _copy(root, s)
    return root, next(c for c in claims if c.id == claim_id)


def test_a_changed_cell_names_the_claim_the_file_line_and_the_sentence(tmp_path: Path) -> None:
    root, claim = _checkout_with(tmp_path, "ring-none-12")
    table = root / claim.sources[0]
    df = pd.read_csv(table)
    row = select(df, claim.where, what="test").index
    df.loc[row, "inflation"] = 0.123
    df.to_csv(table, index=False)
    assert check(REPO) == []  # the checkout's own tables are untouched
    problems = check(root)
    readme = [p for p in problems if p.startswith("README.md:")]
    assert len(readme) == 1, problems
    n = next(c.line for c in citations(root / "README.md") if c.claim == "ring-none-12")
    assert readme[0].startswith(f"README.md:{n}: claim ring-none-12 reads '+0.4 % [-0.8, +1.7]'")
    assert "'+12.3 % [-0.8, +1.7]'" in readme[0]
    assert "Removed by CoDL's ring hand-off" in readme[0]  # the sentence
    assert any(p.startswith("docs/results.md:") and "ring-none-12" in p for p in problems)
    assert any(p.startswith(str(CATALOGUE)) for p in problems)
    # `codl claims render` brings the text to the table, and the check passes again.
    render_all(root)
    assert check(root) == []
    assert "+12.3 % [-0.8, +1.7]" in (root / "README.md").read_text(encoding="utf-8")


def test_a_changed_run_table_moves_the_invocation_level_claim(tmp_path: Path) -> None:
    root, claim = _checkout_with(tmp_path, "nice19-iso")
    table = root / claim.sources[2]
    df = pd.read_csv(table)
    loaded = select(df, claim.where, what="test").index
    df.loc[loaded, "compute_eff_ms_mean"] *= 1.5
    df.to_csv(table, index=False)
    problems = check(root)
    assert any(p.startswith("README.md:") and "claim nice19-iso " in p for p in problems)


def test_the_invocation_is_a_level_of_the_nice19_claim() -> None:
    """Three invocations are three samples: the t interval has 2 degrees of freedom, wider
    than the 33 of the blocks pooled as if independent of their invocation."""
    claims = {c.id: c for c in load_registry(REPO / REGISTRY)}
    level = evaluate(claims["nice19-iso"], REPO)
    pooled = evaluate(claims["nice19-iso-pooled"], REPO)
    assert level.n_invocations == 3
    assert (level.n_blocks, level.n_runs) == (pooled.n_blocks, pooled.n_runs)
    assert level.lo is not None and level.hi is not None
    assert pooled.lo is not None and pooled.hi is not None
    assert level.hi - level.lo > (pooled.hi - pooled.lo) * 2


def _claim(**kw: object) -> Claim:
    raw = {"id": "c", "what": "w", "statistic": "s", "source": "results/t.csv", "value": "v"}
    return claim_from_dict({**raw, **kw}, where="test")


@pytest.mark.parametrize(
    ("fmt", "digits", "value", "lo", "hi", "text"),
    [
        ("change", 0, 1.272, 1.081, 1.497, "+27 % [+8, +50]"),
        ("inflation", 1, 0.004, -0.0084, 0.0173, "+0.4 % [-0.8, +1.7]"),
        ("inflation", 1, -0.0004, -0.0084, 0.0003, "+0.0 % [-0.8, +0.0]"),
        ("ratio", 2, 1.2293, 1.1846, 1.2758, "1.23x [1.18, 1.28]"),
        ("ms", 3, 5.06, 5.05, 5.07, "5.060 ms [5.050, 5.070]"),
        ("number", 0, 3562.4, 3020.0, 3909.0, "3,562 [3,020, 3,909]"),
    ],
)
def test_how_a_number_reads(
    fmt: str, digits: int, value: float, lo: float, hi: float, text: str
) -> None:
    c = _claim(format=fmt, digits=digits)
    assert c.format is Format(fmt)
    v = Value(value=value, lo=lo, hi=hi, n_runs=4, n_blocks=2, n_invocations=1)
    assert render(c, v) == text
    assert render(c, v, "counts") == "2 blocks, 4 runs"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"colour": 1}, "unknown key"),
        ({"format": "percentage"}, "expected one of"),
        ({"function": "f"}, "exactly one of value"),
        ({"sources": ["results/a.csv"]}, "exactly one of source"),
        ({"digits": 9}, "digits"),
        ({"n_runs": -1}, "n_runs"),
        ({"reduce": "sum"}, "reduce"),
        ({"reduce": "median", "interval": ["lo", "hi"]}, "interval"),
    ],
)
def test_a_bad_registry_row_is_refused_with_its_place(raw: dict[str, object], message: str) -> None:
    with pytest.raises(CodlError, match=message):
        _claim(**raw)


def test_a_where_that_selects_no_row_or_two_is_refused(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    pd.DataFrame({"policy": ["none", "none"], "v": [1.0, 2.0]}).to_csv(
        tmp_path / "results" / "t.csv", index=False
    )
    with pytest.raises(CodlError, match="selects 2 rows"):
        evaluate(_claim(where={"policy": "none"}), tmp_path)
    with pytest.raises(CodlError, match="selects 0 rows"):
        evaluate(_claim(where={"policy": "shared"}), tmp_path)
    with pytest.raises(CodlError, match="no column"):
        evaluate(_claim(where={"polcy": "none"}), tmp_path)
    with pytest.raises(CodlError, match="not one of"):
        evaluate(_claim(value=None, function="eval"), tmp_path)


def test_an_unknown_claim_and_an_open_marker_are_refused(tmp_path: Path) -> None:
    root, _ = _checkout_with(tmp_path, "ring-none-12")
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    readme.write_text(text + "\nA <!-- claim:no-such -->1 %<!-- /claim --> claim.\n", "utf-8")
    with pytest.raises(CodlError, match=r"README.md:\d+: claim 'no-such' is not in the registry"):
        check(root)
    readme.write_text(text + "\nAn <!-- claim:ring-none-12 -->open marker.\n", "utf-8")
    with pytest.raises(CodlError, match="without its"):
        check(root)


def test_the_command_checks_and_renders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from codl.cli import main

    assert main(["claims", "check", "--root", str(REPO)]) == 0
    root, claim = _checkout_with(tmp_path, "gpt2-none-4")
    table = root / claim.sources[0]
    df = pd.read_csv(table)
    df.loc[select(df, claim.where, what="t").index, "inflation_hi"] = 0.5
    df.to_csv(table, index=False)
    assert main(["claims", "check", "--root", str(root)]) == 1
    assert "claim gpt2-none-4 reads" in capsys.readouterr().out
    assert main(["claims", "render", "--root", str(root)]) == 0
    assert main(["claims", "check", "--root", str(root)]) == 0


def test_a_checkout_without_a_registry_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from codl.cli import main

    assert main(["claims", "check", "--root", str(tmp_path / "no checkout")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("codl claims: error: ") and "no such claims registry" in err
    assert "Traceback" not in err


def test_a_reduced_column_counts_its_rows_as_runs(tmp_path: Path) -> None:
    (tmp_path / "results").mkdir()
    pd.DataFrame({"policy": ["none"] * 3 + ["shared"], "v": [-0.05, 0.01, 0.02, 9.0]}).to_csv(
        tmp_path / "results" / "t.csv", index=False
    )
    c = _claim(where={"policy": "none"}, reduce="median_abs", format="percent", digits=1)
    v = evaluate(c, tmp_path)
    assert (render(c, v), v.n_runs, v.lo) == ("2.0 %", 3, None)
    worst = _claim(where={"policy": "none"}, reduce="max_abs", format="percent", digits=1)
    assert render(worst, evaluate(worst, tmp_path)) == "5.0 %"
