"""A timed record says how busy the machine was with other work, and the tables and the audit say which timed rows
were taken on a busy machine (issue 37: beside two busy loops llama.cpp decoded 16x slower)."""

import subprocess
import sys
import time

import pandas as pd
import pytest

from moespac import environment, record
from moespac.analysis import audit, tables
from moespac.analysis.labels import unlabelled
from moespac.analysis.rows import COLUMNS, busy_note
from moespac.catalogue import get_method

pytestmark = pytest.mark.skipif(environment.cpu_snapshot() is None, reason="no /proc/stat (not Linux)")


def test_a_busy_process_beside_the_command_is_counted():
    since = environment.cpu_snapshot()
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.5)
        load = environment.machine_load(since)  # before the loop is waited for (then its time would be ours)
    finally:
        loop.kill()
        loop.wait()
    assert load["cpus"] >= 1 and load["wall_s"] >= 1.5
    assert load["other_cpu_share"] >= 0.6 / load["cpus"]  # one busy core of `cpus` (more if the machine is busier)


def test_the_commands_own_time_and_its_childrens_are_not_others(monkeypatch):
    monkeypatch.setattr(environment.os, "cpu_count", lambda: 2)
    # 2 s of wall: the machine's CPUs did 3 CPU-s of work, 1 of them ours (threads or waited-for children)
    assert environment.machine_load((0.0, 10.0, 1.0), now=(2.0, 13.0, 2.0)) == {
        "other_cpu_share": 0.5, "cpus": 2, "wall_s": 2.0}
    assert environment.machine_load((0.0, 10.0, 1.0), now=(2.0, 12.0, 3.0))["other_cpu_share"] == 0.0  # all ours
    assert environment.machine_load(None) is None and environment.machine_load((5.0, 1.0, 1.0), (5.0, 2.0, 1.0)) is None


def test_timed_records_carry_the_load_and_simulated_ones_stay_machine_free():
    record.mark_started()
    measured = record.make_record("bench", "measured", {"a": 1}, {})
    assert set(measured["machine_load"]) == {"other_cpu_share", "cpus", "wall_s"}
    assert 0.0 <= measured["machine_load"]["other_cpu_share"] <= 1.0
    assert "machine_load" not in record.make_record("simulate", "simulated", {"a": 1}, {})


def _rows(*cells):
    out = []
    for timing, method, bench, busy in cells:
        r = dict.fromkeys(COLUMNS)
        r.update(timing=timing, method=method, label=get_method(method).label, benchmark=bench, tps=5.0, latency_s=1.0,
                 hardware="CPU", model="m", source="s", skipped=False, requests=1, max_new_tokens=64,
                 busy_share=busy)
        out.append(r)
    return pd.DataFrame(out, columns=COLUMNS)


def test_tables_and_audit_name_the_rows_timed_on_a_busy_machine(tmp_path):
    df = _rows(("measured", "moespac", "gsm8k", 0.55), ("measured", "moespac", "qa", 0.62),
               ("measured", "hybrimoe", "gsm8k", 0.05), ("measured", "hybrimoe", "qa", None))
    _, blocks = tables.table1(df, ["gsm8k", "qa"])
    [note] = [n for n in blocks[0].notes if "busy machine" in n]
    assert note == ("measured rows timed on a busy machine (other processes used 55%–62% of the CPUs while they ran), "
                    "so their tokens/s understate it: MoE-SpAc on gsm8k, qa")
    assert not busy_note(_rows(("measured", "moespac", "gsm8k", 0.1), ("wrapped", "llamacpp", "gsm8k", None)))
    assert busy_note(_rows(("measured", "moespac", "gsm8k", 0.3), ("wrapped", "llamacpp", "gsm8k", 0.2)))[1] == (
        "wrapped rows timed on a busy machine (other processes used 20%–20% of the CPUs while they ran), so their "
        "tokens/s understate it: llama.cpp on gsm8k")  # one line per timing label: every number on a page has one
    df.to_csv(tmp_path / "t1.csv", index=False)
    page = audit.render(table1=tmp_path / "t1.csv")
    busy = [line for line in page.splitlines() if "busy machine" in line]
    assert busy == ["- " + note] and not unlabelled("\n".join(busy))  # labelled where it stands
    lines = page.splitlines()
    assert lines.index(busy[0]) < lines.index("The wrapped block (external systems as their authors ship them):")


def test_rows_take_the_share_of_timed_records_only():
    from moespac.analysis.rows import busy_share, wrapped_row

    load = {"other_cpu_share": 0.4, "cpus": 2, "wall_s": 9.0}
    assert busy_share({"timing": "measured", "machine_load": load}) == 0.4
    assert busy_share({"timing": "simulated", "machine_load": load}) is None
    assert busy_share({"timing": "measured"}) is None  # a record from before it was measured
    wrapped = dict(timing="wrapped", config=dict(benchmark="gsm8k", system="llama.cpp"), metrics={},
                   machine_load=load)
    assert wrapped_row(wrapped)["busy_share"] == 0.4


def test_mlflow_gets_the_share_as_a_metric_of_timed_runs():
    from moespac.tracking import metrics_of

    record.mark_started()
    measured = record.make_record("bench", "measured", {"a": 1}, {"tokens_per_s": 3.0})
    assert metrics_of(measured)["machine_load.other_cpu_share"] == measured["machine_load"]["other_cpu_share"]
    assert "machine_load.other_cpu_share" not in metrics_of(record.make_record("simulate", "simulated", {}, {}))
