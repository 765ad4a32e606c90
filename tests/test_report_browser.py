"""The Snakemake report of a small real run, opened in a real headless Chromium: every figure is
listed once, its image loads (naturalWidth > 0) when its view button is clicked, and its
information panel shows its own caption.

Chromium is driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: fd 3 in,
fd 4 out, NUL-separated JSON), so no port, no websocket library and no new dependency.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from codl.config import build_plan
from codl.figures import RUN_FIGURES, plan_figures
from codl.paths import ResultPaths
from test_workflow import CONFIG, snakemake

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


def chromium() -> str | None:
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


class DevTools:
    """A minimal DevTools client over Chromium's debugging pipe."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:
            # Chromium reads commands from fd 3 and writes replies to fd 4. The pipe ends may
            # themselves be 3..6: move them above first so one dup2 does not clobber the other.
            # close_fds=False keeps 3 and 4 (it would close every fd above 2); the pipes' own
            # fds are non-inheritable, so nothing else leaks into Chromium.
            high_r, high_w = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--remote-debugging-pipe",
                # Root in a container has no user namespace for the sandbox.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--window-size=1600,1200",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            preexec_fn=fds,  # noqa: PLW1509 - only dup2 runs between fork and exec
            close_fds=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf = b""
        self._id = 0

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        for reply in self._messages():
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result
        raise RuntimeError(f"Chromium closed the pipe during {method}")

    def _messages(self) -> Iterator[dict[str, Any]]:
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                yield json.loads(raw)
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                return
            self._buf += chunk

    def evaluate(self, session: str, expression: str) -> Any:
        out = self.call(
            "Runtime.evaluate",
            session,
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
            timeout=120_000,
        )
        if "exceptionDetails" in out:
            raise RuntimeError(out["exceptionDetails"])
        return out["result"].get("value")

    def wait_for(self, session: str, condition: str, *, timeout: float = 60.0) -> None:
        """Poll ``condition`` in the page: its document may still be loading, or be the
        about:blank before the navigation, so one long-running evaluation would be lost."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.evaluate(session, condition) is True:
                    return
            except RuntimeError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"page never satisfied {condition!r} in {timeout:.0f} s")

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):
            self.call("Browser.close")
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._to_browser)
        os.close(self._from_browser)


# True once the report's React app has mounted (``app`` alone is also the #app element).
READY = (
    "document.readyState === 'complete' && typeof categories !== 'undefined'"
    " && typeof app.setView === 'function'"
)

# Clicks through the report as a reader would: the Figures category, each subcategory, then per
# figure its view button (the eye) and its information button; records what the page shows.
WALK = """
(async () => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const out = [];
  for (const [sub, paths] of Object.entries(categories["Figures"] || {})) {
    for (const path of paths) {
      const entry = results[path];
      // A row shows the result's labels when it has them, else its file name.
      const keys = entry.labels ? Object.values(entry.labels) : [entry.name];
      app.setView({navbarMode: "subcategory", category: "Figures", subcategory: sub});
      let row = null;
      for (let i = 0; i < 100 && !row; i++) {
        await sleep(20);
        row = [...document.querySelectorAll("tr")].find(
          (tr) => keys.every((k) => tr.innerText.includes(k)));
      }
      const links = row ? [...row.querySelectorAll("a")] : [];
      for (const a of links) { a.click(); await sleep(50); }
      let img = null;
      for (let i = 0; i < 200; i++) {
        img = [...document.querySelectorAll("img")].find((x) => x.src === entry.data_uri);
        if (img && img.complete) break;
        await sleep(25);
      }
      out.push({
        path: path,
        subcategory: sub,
        row: !!row,
        buttons: links.length,
        mime: entry.mime_type,
        loaded: !!img && img.complete,
        naturalWidth: img ? img.naturalWidth : 0,
        caption: entry.caption,
        shown: document.body.innerText,
      });
    }
  }
  return out;
})()
"""


def plain(caption_html: str) -> str:
    """The caption's text as a browser renders it (tags gone, whitespace collapsed)."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", caption_html)).split())


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("report") / "work dir"
    work.mkdir()
    cfg = work.parent / "config.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    snakemake(work, cfg)
    out = ResultPaths(work, set_name="config").report
    snakemake(work, cfg, "--report", str(out))
    return out


@pytest.fixture(scope="module")
def binary() -> str:
    """The browser, found before the workflow runs: no minute of Snakemake for a skip."""
    found = chromium()
    if found is None:
        tried = ", ".join(BROWSERS)
        why = f"no Chromium binary on PATH (tried {tried}); `make test-tools` installs it"
        # CI runs `make test`, which installs it: there a missing browser is a failure, so
        # that the report is opened in a real browser on every submission.
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return found


def test_every_figure_loads_in_chromium_with_its_own_caption(
    binary: str, report: Path, tmp_path: Path
) -> None:
    browser = DevTools(binary, tmp_path / "profile")
    try:
        target = browser.call("Target.createTarget", url=report.resolve().as_uri())["targetId"]
        session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        browser.call("Runtime.enable", session)
        browser.wait_for(session, READY)
        shown = browser.evaluate(session, WALK)
    finally:
        browser.close()

    # Each figure once, as a PNG: the PDFs stay on disk, out of the report.
    planned = plan_figures(build_plan(CONFIG).specs.values())
    assert sorted(Path(f["path"]).name for f in shown) == sorted(f"{n}.png" for n in planned)
    assert {f["mime"] for f in shown} == {"image/png"}
    assert {f["subcategory"] for f in shown} == {"Interference", "Mechanism"}
    captions = [plain(f["caption"]) for f in shown]
    assert len(set(captions)) == len(captions), "two figures share a caption"
    for fig, caption in zip(shown, captions, strict=True):
        name = Path(fig["path"]).name
        assert fig["row"] and fig["buttons"] >= 2, f"{name}: no row with view/info buttons"
        assert fig["loaded"] and fig["naturalWidth"] > 0, f"{name}: image did not load"
        # The information panel shows this figure's caption (its first 80 characters).
        assert caption[:80] in " ".join(fig["shown"].split()), f"{name}: caption not shown"


def test_every_figure_has_a_report_entry_and_a_caption_file() -> None:
    """The figures rule's outputs are made from the catalog (common.smk, get_figure_outputs):
    every run figure is an output of the rule with the caption of its own name, and each
    caption exists and says something. A figure added to the catalog without a caption file
    would fail the report; this says which."""
    rules = (REPO / "workflow" / "rules" / "analysis.smk").read_text()
    common = (REPO / "workflow" / "rules" / "common.smk").read_text()
    assert "**get_figure_outputs()," in rules.split("rule figures:", 1)[1]
    assert 'caption=f"../report/{name.value}.rst"' in common
    assert "for name, labels in RUN_FIGURES.items()" in common
    for name, labels in RUN_FIGURES.items():
        assert labels.subcategory in {"Interference", "Mechanism"} and labels.statistic
        text = (REPO / "workflow" / "report" / f"{name.value}.rst").read_text()
        assert len(text.split()) > 40, f"{name.value}.rst says too little"
