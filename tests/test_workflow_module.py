"""The workflow as the Snakemake ecosystem takes it: the catalog's layout (workflow/Snakefile,
config/README.md, .snakemake-workflow-catalog.yml, a LICENSE) and a deployment that uses it as a
module (`module codl: snakefile: ...; use rule * from codl`), dry-run with real Snakemake."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from codl.config import build_plan, load_yaml
from shellenv import without_venv
from test_workflow import job_counts

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"


def test_the_repository_has_the_catalogs_layout() -> None:
    assert (REPO / "workflow" / "Snakefile").is_file()
    # `snakemake` at the root finds workflow/Snakefile itself; a root Snakefile would be run
    # instead, and the catalog would show two entry points.
    assert not (REPO / "Snakefile").exists()
    assert (REPO / "config" / "README.md").is_file()
    catalog = yaml.safe_load((REPO / ".snakemake-workflow-catalog.yml").read_text())
    usage = catalog["usage"]
    assert usage["software-stack-deployment"]["conda"] is True
    assert usage["report"] is True
    assert usage["mandatory-flags"]["desc"].strip()
    license_text = (REPO / "LICENSE").read_text()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text


def _deploy(dest: Path, config: Path, *, prefix: str = "") -> None:
    """What `snakedeploy deploy-workflow` writes, with a local path for the module's Snakefile:
    workflow/Snakefile that uses every rule of codl's, and config/config.yaml."""
    (dest / "workflow").mkdir(parents=True)
    (dest / "config").mkdir()
    shutil.copy2(config, dest / "config" / "config.yaml")
    rename = f" as {prefix}*" if prefix else ""
    (dest / "workflow" / "Snakefile").write_text(
        'configfile: "config/config.yaml"\n\n\n'
        "module codl:\n"
        "    snakefile:\n"
        f"        {str(REPO / 'workflow' / 'Snakefile')!r}\n"
        "    config:\n"
        "        config\n\n\n"
        f"use rule * from codl{rename}\n"
    )


def _dry_run(cwd: Path, *args: str) -> str:
    # A fresh shell: the venv's bin (and its codl) not on PATH.
    env = without_venv()
    env.pop("CODL_ROOT", None)
    proc = subprocess.run(
        [str(SNAKEMAKE), "--dry-run", "--cores", "2", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.mark.slow
def test_the_workflow_deploys_as_a_module_and_dry_runs(tmp_path: Path) -> None:
    config = REPO / "config" / "smoke.yaml"
    plan = build_plan(load_yaml(config), source=str(config))
    dest = tmp_path / "deployed"
    _deploy(dest, config)
    before = sorted(p.name for p in REPO.iterdir())
    counts = job_counts(_dry_run(dest))
    # The module's default target (`all`) with every run of the deployment's config: one spec,
    # run and summary per run, the comparison and figures once.
    assert counts["all"] == 1
    assert counts["run"] == counts["spec"] == counts["summarize"] == len(plan.specs) > 0
    assert counts["compare"] == counts["figures"] == 1
    # The same jobs as `snakemake` run in the checkout with that config.
    root = tmp_path / "root"
    root.mkdir()
    same = job_counts(_dry_run(REPO, "--configfile", str(config), "--directory", str(root)))
    assert same == counts
    # A dry-run writes nothing but Snakemake's own bookkeeping, and nothing into the checkout.
    assert {p.name for p in dest.iterdir()} <= {"workflow", "config", ".snakemake"}
    assert sorted(p.name for p in REPO.iterdir()) == before


@pytest.mark.slow
def test_a_module_deployment_builds_its_conda_env_from_the_checkout(tmp_path: Path) -> None:
    # workflow/envs/codl.yaml installs `-e ${CODL_ROOT}`: the codl checkout, not the directory
    # of the deployment's Snakefile (workflow.basedir), which holds no package.
    dest = tmp_path / "deployed"
    _deploy(dest, REPO / "config" / "smoke.yaml")
    with (dest / "workflow" / "Snakefile").open("a") as fh:
        fh.write(
            '\n\nrule codl_root:\n    output:\n        "codl_root.txt",\n'
            '    shell:\n        "printf %s \\"$CODL_ROOT\\" > {output}"\n'
        )
    env = {k: v for k, v in os.environ.items() if k != "CODL_ROOT"}
    proc = subprocess.run(
        [str(SNAKEMAKE), "--cores", "1", "codl_root.txt"],
        cwd=dest,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert Path((dest / "codl_root.txt").read_text()) == REPO.resolve()


@pytest.mark.slow
def test_the_module_rules_can_be_renamed(tmp_path: Path) -> None:
    # `use rule * from codl as codl_*`: the deployment may mix codl's rules with its own.
    dest = tmp_path / "deployed"
    _deploy(dest, REPO / "config" / "smoke.yaml", prefix="codl_")
    counts = job_counts(_dry_run(dest))
    assert counts["codl_all"] == 1 and counts["codl_run"] > 0
    assert not {"all", "run"} & set(counts)
