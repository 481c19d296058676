"""pip_download: a cached file is reused, an absent one is fetched once, a failed fetch names the requirement."""

import subprocess
import threading
import time
from pathlib import Path

import pytest

from moespac import fetch
from moespac.errors import MoespacError


def test_cached_file_is_reused_without_pip(tmp_path, monkeypatch):
    (tmp_path / "x_pkg-1.0-py3-none-any.whl").write_bytes(b"w")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip must not run"))
    assert fetch.pip_download("x-pkg==1.0", tmp_path, "x_pkg-1.0-*.whl").name == "x_pkg-1.0-py3-none-any.whl"


def test_absent_file_is_downloaded_with_no_deps(tmp_path, monkeypatch):
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        (Path(cmd[cmd.index("-d") + 1]) / "x_pkg-1.0.tar.gz").write_bytes(b"s")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    got = fetch.pip_download("x-pkg==1.0", tmp_path / "d", "x_pkg-1.0.tar.gz", sources=True)
    assert got == tmp_path / "d" / "x_pkg-1.0.tar.gz"
    assert calls[0][1:5] == ["-m", "pip", "download", "--no-deps"] and "--no-binary" in calls[0]
    assert calls[0][-1] == "x-pkg==1.0"


def test_failed_download_names_the_requirement(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "ERROR: no net"))
    with pytest.raises(MoespacError, match=r"could not download x-pkg==1.0 .*no net"):
        fetch.pip_download("x-pkg==1.0", tmp_path, "x_pkg-1.0-*.whl")


def test_two_jobs_at_once_download_once_and_never_read_a_partial_file(tmp_path, monkeypatch):
    """Two proxy builds start together and both need the ShareGPT wheel (a clean-clone run failed on a
    half-written one): the second waits for the first, pip runs once, both get the whole file."""
    calls = []

    def slow_run(cmd, **kw):
        calls.append(cmd)
        out = Path(cmd[cmd.index("-d") + 1]) / "x_pkg-1.0-py3-none-any.whl"
        with open(out, "wb") as f:
            f.write(b"first half ")
            f.flush()
            time.sleep(0.3)
            f.write(b"second half")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", slow_run)
    got = []  # what each job reads the moment it has its file, as the corpus reader does

    def job():
        got.append(fetch.pip_download("x-pkg==1.0", tmp_path, "x_pkg-1.0-*.whl").read_bytes())

    jobs = [threading.Thread(target=job) for _ in range(2)]
    for j in jobs:
        j.start()
        time.sleep(0.05)
    for j in jobs:
        j.join()
    assert len(calls) == 1 and len(got) == 2
    assert got == [b"first half second half"] * 2
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["x_pkg-1.0-py3-none-any.whl"]
