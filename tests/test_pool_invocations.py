"""A set measured over several invocations (nodes, allocations, days): a config named
``<set>/<invocation>`` writes its own sub-set, and the workflow's ``pool_invocations`` rule pools
it with the set's other invocations into ``results/<set>/tables/``, the invocation a level."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from codl.errors import ConfigError
from codl.paths import ResultPaths, check_set_name
from test_workflow import CONFIG, snakemake


@pytest.mark.parametrize("name", ["nice-h200", "nice-h200/a", "x.1/node-2_b"])
def test_a_set_or_one_invocation_of_it_is_a_name(name: str) -> None:
    assert check_set_name(name) == name


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("a/b/c", "<set>/<invocation>"),
        ("/a", "cannot name a result set"),
        ("a/", "cannot name a result set"),
        ("a/../b", "cannot name a result set"),
        ("runs/a", "the runs' directory"),
        ("a/tables", "a folder of every result set"),
    ],
)
def test_a_bad_name_is_one_line_naming_the_key(name: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_set_name(name)
    (line,) = err.value.problems
    assert line.startswith("name: ") and says in line


def test_an_invocation_finds_the_runs_tables_of_its_siblings_only(tmp_path: Path) -> None:
    b = ResultPaths(tmp_path, set_name="inv/b")
    assert ResultPaths(tmp_path, set_name="inv").parent is None
    assert b.parent == ResultPaths(tmp_path, set_name="inv")
    for name, table in [("a", "pooled_runs.csv"), ("b", "pooled_runs.csv"), ("c", "gil_runs.csv")]:
        (tmp_path / "results" / "inv" / name / "tables").mkdir(parents=True)
        (tmp_path / "results" / "inv" / name / "tables" / table).write_text("run_id\n")
    (tmp_path / "results" / "inv" / "d").mkdir()  # no table yet: not an invocation to pool
    (tmp_path / "results" / "inv" / "tables").mkdir()  # the parent's own
    assert [p.relative_to(tmp_path).as_posix() for p in b.sibling_runs_tables()] == [
        "results/inv/a/tables/pooled_runs.csv",
        "results/inv/c/tables/gil_runs.csv",
    ]


def test_the_second_invocation_pools_both_into_the_parent(tmp_path: Path) -> None:
    """Two invocations of one block each (seeds 0 and 1: other runs): the first has no sibling
    and writes only its sub-set; the second pools both, each invocation's block its own."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    parent = ResultPaths(workdir, set_name="inv")
    configs = {}
    for name, seed in (("a", 0), ("b", 1)):
        cfg = {
            "name": f"inv/{name}",
            "defaults": {**CONFIG["defaults"], "seed": seed},
            "experiments": [
                {"name": "pair", "factors": {"mode": ["compute", "data+compute"]}, "repeats": 1}
            ],
            "blocks": {"order": "abba"},
        }
        configs[name] = tmp_path / f"inv-{name}.yaml"
        configs[name].write_text(yaml.safe_dump(cfg))

    _, first = snakemake(workdir, configs["a"])
    assert first["run"] == 2 and "pool_invocations" not in first, first
    assert ResultPaths(workdir, set_name="inv/a").pooled_runs_table.is_file()
    assert not parent.tables.exists()

    _, second = snakemake(workdir, configs["b"])
    assert second["run"] == 2 and second["pool_invocations"] == 1, second
    inflation = pd.read_csv(parent.pooled_inflation_table)
    assert list(inflation["n_blocks"]) == [2]
    levels = pd.read_csv(parent.pooled_levels_table)
    assert set(levels["n_invocations"]) == {2}
    assert set(levels["method"]) >= {"blocks"}
    assert parent.pooled_throughput_table.is_file()
    # Each invocation's own tables stay its own: one block each.
    for name in ("a", "b"):
        own = pd.read_csv(ResultPaths(workdir, set_name=f"inv/{name}").pooled_inflation_table)
        assert list(own["n_blocks"]) == [1]

    out, third = snakemake(workdir, configs["a"])
    assert not third, out[-2000:]


def test_the_schema_checks_the_name_as_the_paths_do() -> None:
    from codl.config import SET_NAME_PATTERN, schema

    assert schema()["properties"]["name"]["pattern"] == SET_NAME_PATTERN
