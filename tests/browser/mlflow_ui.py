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


def expected(study: Path) -> dict[str, str]:
    """Run-name prefix -> tokens/s as the UI rounds it, for the simulated cells of METHODS in table1.csv."""
    t = pd.read_csv(study / "paper_figs/table1.csv")
    cells = t[(t["timing"] == "simulated") & (t["hardware"] == HARDWARE) & t["method"].isin(METHODS)
              & (t["benchmark"] != "average")]
    return {f"{r.method}/{r.benchmark}/simulated": r.tps for r in cells.itertuples()}


def check(study: Path, out: Path) -> int:
    from playwright.sync_api import sync_playwright

    port = free_port()
    server = serve(study / "results/mlflow.db", port)
    try:
        exp = experiment_id(port, "moespac/table1")
        want = expected(study)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1600, "height": 900})
            page.goto(f"http://127.0.0.1:{port}/#/experiments/{exp}/runs")  # no view forced: the experiment's kind
            page.wait_for_selector("text=matching runs", timeout=60_000)
            if page.get_by_text("Training runs").count() + page.get_by_role("heading", name="Runs").count() == 0:
                print("the experiment did not open as a runs table", file=sys.stderr)
                return 1
            search = page.get_by_placeholder("metrics.rmse < 1 and params.model = \"tree\"")
            search.fill(f"tags.`moespac.timing` = 'simulated' and tags.`moespac.hardware` = '{HARDWARE}'")
            search.press("Enter")
            page.wait_for_timeout(1500)
            page.get_by_role("button", name="Columns").click()
            page.get_by_placeholder("Search columns").fill("tokens_per_s")
            # the column tree lists every metric matching the search; pick the one named exactly tokens_per_s
            page.locator("[class*=tree-title]", has_text=re.compile(r"^tokens_per_s$")).first.click()
            page.keyboard.press("Escape")
            for hide in page.get_by_role("button", name="Close").all():  # the assistant panel, if open
                if hide.is_visible():
                    hide.click()
            page.wait_for_timeout(1500)
            header = page.locator("[role=columnheader]", has_text="tokens_per_s")
            if header.count() == 0:
                print("no tokens_per_s column in the runs table", file=sys.stderr)
                return 1
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
        missing = [k for k in want if not any(name.startswith(k) for name in rows)]
        if missing:
            print(f"runs not shown: {missing}; shown: {sorted(rows)}", file=sys.stderr)
            return 1
        for key, tps in want.items():
            cells = next(c for name, c in rows.items() if name.startswith(key))
            if not any(_close(c, tps) for c in cells):
                print(f"{key}: no cell shows tokens/s {tps:.4g} (cells: {cells})", file=sys.stderr)
                return 1
        print(f"MLflow UI shows tokens_per_s for {len(want)} simulated cells on {HARDWARE} equal to table1.csv; "
              f"screenshot {out}")
        return 0
    finally:
        server.terminate()
        server.wait(timeout=30)


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
