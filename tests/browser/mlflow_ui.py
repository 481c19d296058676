"""Browser check of the MLflow UI over a finished study: the Table 1 experiment opens as a runs table, one
search narrows it to the simulated cells on a hardware profile, and `tokens_per_s` is a column whose values are
the table's. It writes a screenshot of what it saw.

Needs a headless Chromium (Debian: `apt-get install chromium`) and Playwright to drive it (`pip install
playwright`; it uses the system Chromium, no browser download). Run it in the folder where the study ran:

    python tests/browser/mlflow_ui.py --study . --out docs/mlflow-table1-runs.png

Exit 0 when the UI shows what the table says, 1 otherwise (with the reason).
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pandas as pd

HARDWARE = "rtx4090-pcie4"
METHODS = ("moespac", "hybrimoe")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(db: Path, port: int) -> subprocess.Popen:
    """`mlflow server` on 127.0.0.1 over the study's store, once it answers /health."""
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return server
        except OSError:
            if server.poll() is not None:
                raise SystemExit("mlflow server exited")
            time.sleep(1)
    server.terminate()
    raise SystemExit("mlflow server did not come up in 120 s")


def experiment_id(port: int, name: str) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/get-by-name?experiment_name={name}")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["experiment"]["experiment_id"]


def expected(study: Path) -> tuple[str, dict[str, float]]:
    """(benchmark, run-name prefix -> tokens/s) for the simulated cells of METHODS in table1.csv on one benchmark
    (the first one: a page of the UI shows 100 runs, one benchmark's cells fit)."""
    t = pd.read_csv(study / "paper_figs/table1.csv")
    cells = t[(t["timing"] == "simulated") & (t["hardware"] == HARDWARE) & t["method"].isin(METHODS)
              & (t["benchmark"] != "average")]
    benchmark = cells["benchmark"].iloc[0]
    cells = cells[cells["benchmark"] == benchmark]
    return benchmark, {f"{r.method}/{r.benchmark}/simulated": r.tps for r in cells.itertuples()}


def check(study: Path, out: Path) -> int:
    port = free_port()
    server = serve(study / "results/mlflow.db", port)
    try:
        exp = experiment_id(port, "moespac/table1")
        benchmark, want = expected(study)
        for attempt in range(3):  # the UI re-renders while it loads; a session that lost an element starts over
            try:
                rows = _session(port, exp, benchmark, out)
                break
            except Exception as e:  # noqa: BLE001 - Playwright's timeouts
                if attempt == 2:
                    print(f"the UI did not show the runs table: {str(e).splitlines()[0]}", file=sys.stderr)
                    return 1
        if rows is None:
            return 1
        missing = [k for k in want if not any(name.startswith(k) for name in rows)]
        if missing:
            print(f"runs not shown: {missing}; shown: {sorted(rows)}", file=sys.stderr)
            return 1
        for key, tps in want.items():
            cells = next(c for name, c in rows.items() if name.startswith(key))
            if not any(_close(c, tps) for c in cells):
                print(f"{key}: no cell shows tokens/s {tps:.4g} (cells: {cells})", file=sys.stderr)
                return 1
        print(f"MLflow UI shows tokens_per_s for {len(want)} simulated cells ({benchmark}) on {HARDWARE} "
              f"equal to table1.csv; screenshot {out}")
        return 0
    finally:
        server.terminate()
        server.wait(timeout=30)


def _session(port: int, exp: str, benchmark: str, out: Path) -> dict | None:
    """One browser session: open the experiment, search, add the column; {run name: its cells}, screenshot."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 900})
        page.goto(f"http://127.0.0.1:{port}/#/experiments/{exp}/runs")  # no view forced: the experiment's kind
        page.wait_for_selector("text=matching runs", timeout=60_000)
        try:  # the experiment's kind opens it as a runs table (not the GenAI traces view)
            page.wait_for_selector("text=/^(Training runs|Runs)$/", timeout=30_000)
        except Exception:
            print("the experiment did not open as a runs table", file=sys.stderr)
            return None
        for hide in page.get_by_role("button", name="Close").all():  # the assistant panel, before the search
            if hide.is_visible():  # box has text (its own clear button is a 'Close' too)
                hide.click()
        # the one search, as the search box writes it into the page's address (typing races the page's reloads)
        query = (f"tags.`moespac.timing` = 'simulated' and tags.`moespac.hardware` = '{HARDWARE}' and "
                 f"tags.`moespac.benchmark` = '{benchmark}'")
        page.goto(f"http://127.0.0.1:{port}/#/experiments/{exp}/runs?searchFilter={urllib.parse.quote_plus(query)}")
        page.wait_for_selector("text=/^([0-9]|[1-9][0-9]) matching runs$/", timeout=60_000)
        pick_column(page, "tokens_per_s")
        page.keyboard.press("Escape")
        page.wait_for_timeout(1500)
        header = page.locator("[role=columnheader]", has_text="tokens_per_s")
        if header.count() == 0:
            print("no tokens_per_s column in the runs table", file=sys.stderr)
            return None
        # the grid draws pinned and scrolling columns in separate containers: join a run's cells by row index
        by_index: dict[str, list[str]] = {}
        for row in page.locator("[role=row][row-index]").all():
            texts = [c.strip().splitlines()[-1] for c in row.locator("[role=gridcell]").all_inner_texts() if c.strip()]
            by_index.setdefault(row.get_attribute("row-index"), []).extend(texts)
        rows = {}
        for cells in by_index.values():
            name = next((c for c in cells if c.count("/") >= 2), None)  # the run name (after its colour chip)
            if name:
                rows[name] = cells
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out))
        browser.close()
    return rows


def pick_column(page, name: str, tries: int = 3) -> None:
    """Add the metric column `name` through the Columns menu; the menu re-renders while the runs table loads,
    so a pick that finds no entry reopens it (up to `tries` times)."""
    entry = page.locator("[class*=tree-title]", has_text=re.compile(rf"^{re.escape(name)}$"))
    for attempt in range(tries):
        page.get_by_role("button", name="Columns", exact=True).last.click()  # a second one can render beside it
        page.get_by_placeholder("Search columns").fill(name)
        try:
            entry.first.click(timeout=10_000)
            return
        except Exception:
            if attempt == tries - 1:
                raise
            page.keyboard.press("Escape")
            page.wait_for_timeout(2000)


def _close(text: str, value: float) -> bool:
    """The UI rounds metrics for display: a cell matches when it parses to the value at its shown precision."""
    try:
        shown = float(text)
    except ValueError:
        return False
    digits = len(text.split(".")[1]) if "." in text else 0
    return abs(shown - value) <= 0.5 * 10 ** -digits + 1e-12


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", type=Path, default=Path("."), help="folder where the study ran (default: .)")
    ap.add_argument("--out", type=Path, default=Path("docs/mlflow-table1-runs.png"), help="screenshot (PNG)")
    args = ap.parse_args()
    sys.exit(check(args.study.resolve(), args.out))
