"""Issue 10's promises at the command line: a signal ends `gtrain run` as Ctrl+C does (teardown, the cost
report, exit 128+N), and `down` finishes its teardown whatever happens to its output pipe."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gtrain
from gtrain.state import StateStore

JOBS = Path(__file__).parent / "jobs"


def spec_file(tmp: Path, name: str, run: str) -> Path:
    work = tmp / "w"
    work.mkdir(exist_ok=True)
    shutil.copy(JOBS / "contract.py", work / "contract.py")
    p = tmp / f"{name}.yaml"
    p.write_text(json.dumps({"name": name, "provider": "local", "num_nodes": 2,
                             "job": {"workdir": str(work), "run": run, "nproc_per_node": 1,
                                     "python": sys.executable, "env": {"OMP_NUM_THREADS": "1"}}}))
    return p


def left_running(job_id: str) -> list[str]:
    out = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"GTRAIN_JOB_ID={job_id}".encode() in env.read_bytes():
                out.append(env.parent.name)
        except OSError:
            pass
    return out


def cluster_state(name: str) -> tuple[str | None, list[str]]:
    store = StateStore()
    try:
        c = store.find_cluster(name)
        jobs = [j.id for j in store.jobs(c.id)] if c else []
        return (c.status if c else None), jobs
    finally:
        store.close()


@pytest.mark.parametrize("how", ["TERM", "HUP", "TERM-group"])
def test_a_signal_ends_run_like_ctrl_c(how: str, tmp_path: Path, gtrain_home: Path) -> None:
    name = f"sig-{how.lower()}"
    spec = spec_file(tmp_path, name, "contract.py --sleep 300")
    p = subprocess.Popen([sys.executable, "-m", "gtrain", "run", str(spec), "--to", str(tmp_path / "ck")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    assert p.stdout is not None
    deadline = time.monotonic() + 120
    for line in p.stdout:  # once training prints
        if "contract hello" in line:
            break
        assert time.monotonic() < deadline
    sig = signal.SIGHUP if how == "HUP" else signal.SIGTERM
    if how.endswith("group"):
        os.killpg(p.pid, sig)
    else:
        p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, (p.returncode, err[-2000:])
    assert "total:" in out, out  # the cost report, after teardown
    status, jobs = cluster_state(name)
    assert status == "terminated" and len(jobs) == 1, err[-2000:]
    assert not (gtrain_home / "clusters" / name).exists()
    deadline = time.monotonic() + 30
    while left_running(jobs[0]):  # the ranks were stopped, not left behind
        assert time.monotonic() < deadline, left_running(jobs[0])
        time.sleep(0.2)


def test_down_finishes_when_its_output_pipe_closes(tmp_path: Path, gtrain_home: Path) -> None:
    gtrain.up(json.loads(spec_file(tmp_path, "piped", "contract.py").read_text()) and
              str(spec_file(tmp_path, "piped", "contract.py")))
    rc_file = tmp_path / "rc"
    r = subprocess.run(["bash", "-c", f"{sys.executable} -m gtrain down piped --yes | head -c 0; "
                        f"echo ${{PIPESTATUS[0]}} > {rc_file}"], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert rc_file.read_text().strip() == "0", r.stderr
    assert cluster_state("piped")[0] == "terminated"
    assert not (gtrain_home / "clusters" / "piped").exists()
    assert "piped-0" not in (gtrain_home / "ssh" / "config").read_text() if (gtrain_home / "ssh" / "config").exists() \
        else True
