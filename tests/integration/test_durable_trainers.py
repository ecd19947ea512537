"""Trainer patterns, killed mid-run (local provider, 2 nodes, moto's S3 as the store): nanoGPT's one fixed
``ckpt.pt`` rewritten by global rank 0 after every step, Hugging Face Trainer's ``checkpoint-N/`` folders with
per-rank files, DeepSpeed ZeRO's ``global_stepN/`` per-rank shards (tests/integration/jobs/trainer_patterns.py).
Node 1 is killed once both ranks saved step STALL_AT (nothing newer exists anywhere: the ranks are in lock-step):
the run resumes from exactly that step on both nodes (collected from the nodes if the uploads had not finished),
ends with the weights of an uninterrupted run, and the result pulled is the final one. The ZeRO case has node 1
slower to write: it is killed before writing its shard of step STALL_AT, when node 0's part of it (and
``latest`` naming it) had reached the store: the newest WHOLE step is STALL_AT - 2, both nodes resume from it,
found by ``latest`` as DeepSpeed finds it. Each pattern resumes as its trainer does (the folder ``latest``
names, the highest ``checkpoint-N/``), and checks that it is what gtrain restored."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.jobs.backend import LogLine
from tests.integration import durable_nodes as dn
from tests.integration.jobs.trainer_patterns import reference
from tests.integration.test_durable_local import bucket, fast  # noqa: F401 - fast is a fixture
from tests.integration.test_durable_runs import _until

pytestmark = pytest.mark.usefixtures("fast")  # quick polls, no metadata server to ask

JOBS = Path(__file__).parent / "jobs"
STEPS, STALL_AT = 10, 6


@pytest.mark.parametrize("pattern", ["nanogpt", "hf", "zero"])
def test_a_trainer_pattern_killed_mid_run_resumes_from_the_newest(moto_server: str, gtrain_home: Path,
                                                                  tmp_path: Path, pattern: str) -> None:
    store = bucket(moto_server, f"trainer-{pattern}")
    signals = tmp_path / "signals"
    signals.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(JOBS / "trainer_patterns.py", work / "trainer_patterns.py")
    name = f"tp{pattern}"
    slow = pattern == "zero"  # node 1 slower to write: step STALL_AT is partial when it is killed
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "name": name, "provider": "local", "num_nodes": 2,
        "job": {"workdir": str(work), "run": f"trainer_patterns.py {pattern} {STEPS} 0.2 {STALL_AT}"
                                            + (" slow" if slow else ""),
                "nproc_per_node": 1, "checkpoint_dir": "ckpt", "checkpoint_store": store,
                "checkpoint_tuning": {"settle_s": 1, "poll_s": 0.3},
                "env": {"OMP_NUM_THREADS": "1", "SIGNALS": str(signals)}},
        "policies": {"recovery": {"max_restarts": 1, "backoff_s": 0}}}))
    errors: list[BaseException] = []

    def killer() -> None:
        try:
            _until(lambda: (signals / "stalled").exists(), "rank 1 to save step STALL_AT", timeout=240)
            jobs = list((gtrain_home / "clusters" / name / "node-1" / "jobs").glob("*/pid"))
            if slow:  # node 0's part of step STALL_AT and `latest` naming it are in the store
                ups = gtrain_home / "clusters" / name / "node-0" / "jobs" / jobs[0].parent.name / "ckpt-uploads.jsonl"
                _until(lambda: {f"global_step{STALL_AT}", "latest"} <= {
                    json.loads(x)["name"] for x in (ups.read_text().splitlines() if ups.exists() else [])},
                    "node 0 to upload its part of step STALL_AT", timeout=60)
            assert dn.kill9(dn.pids_where(dn.of_node(jobs[0].parent.name, 1))) > 0
        except (AssertionError, OSError) as e:  # shown by the test
            errors.append(e)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    lines: list[LogLine] = []
    res = gtrain.run(spec, to=tmp_path / "out", on_line=lines.append)
    t.join(timeout=5)
    text = [x.text for x in lines]
    assert not errors, errors
    assert res.status == "succeeded" and res.exit_code == 0, (res, text[-30:])
    assert len(res.recoveries) == 1 and 1 in res.recoveries[0]["lost"], res.recoveries
    starts = sorted(x for x in text if x.startswith("attempt 2 "))
    at = STALL_AT - 2 if slow else STALL_AT
    assert starts == [f"attempt 2 rank 0 start {at}", f"attempt 2 rank 1 start {at}"], text[-30:]
    out = tmp_path / "out"
    final = json.loads((out / "final.bin").read_text())
    assert final == {"step": STEPS, "w": reference(STEPS)}
    newest = {"nanogpt": out / "ckpt.pt", "hf": out / f"checkpoint-{STEPS}" / "model.bin",
              "zero": out / f"global_step{STEPS}" / "mp_rank_00_model_states.pt"}[pattern]
    assert json.loads(newest.read_text()) == final
    if pattern == "zero":
        assert (out / "latest").read_text() == f"global_step{STEPS}"


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["nanogpt", "hf", "zero"])
def test_a_trainer_pattern_killed_mid_run_on_ssh_hosts(moto_bridge: str, ssh_hosts: Any, tmp_path: Path,
                                                       gtrain_home: Path, monkeypatch: pytest.MonkeyPatch,
                                                       pattern: str) -> None:
    """The same on two real sshd hosts (the store: moto's S3 at an address the hosts reach)."""
    from gtrain.remote import ssh as sshmod

    sshmod.close_all()
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    hosts = [ssh_hosts[0], ssh_hosts[1]]
    name = f"ts{pattern}"
    spec, _store = dn.durable_spec(tmp_path, name, moto_bridge, provider="ssh", ssh={
        "user": hosts[0].user, "identity_file": hosts[0].identity_file, "python": sys.executable,
        "hosts": [f"{h.address}:{h.port}" for h in hosts],
        "host_keys": {f"{h.address}:{h.port}": h.host_key_line for h in hosts}})
    signals = tmp_path / "signals"
    signals.mkdir()
    work = tmp_path / "work"
    shutil.copy(JOBS / "trainer_patterns.py", work / "trainer_patterns.py")
    doc = json.loads(spec.read_text())
    doc["job"].update(run=f"trainer_patterns.py {pattern} {STEPS} 0.2 {STALL_AT}",
                      checkpoint_tuning={"settle_s": 1, "poll_s": 0.3})
    doc["job"]["env"]["SIGNALS"] = str(signals)
    doc["policies"]["recovery"]["max_restarts"] = 1
    spec.write_text(json.dumps(doc))
    notes = dn.Notes()
    assert gtrain.up(spec, report=notes).created
    try:
        job = gtrain.launch(spec, report=notes)
        killed: list[int] = []

        def kill() -> None:
            _until(lambda: (signals / "stalled").exists(), "rank 1 to save step STALL_AT", timeout=240)
            killed.append(dn.kill9(dn.pids_where(dn.of_node(job.job_id, 1))))

        t = threading.Thread(target=kill, daemon=True)
        t.start()
        lines: list[LogLine] = []
        final = gtrain.wait(name, job_id=job.job_id, on_line=lines.append, report=notes)
        t.join(timeout=5)
        assert killed and killed[0] > 0, "node 1 was never killed"
        assert (final.status, final.exit_code) == ("succeeded", 0), dn.why(lines, notes, final)
        starts = sorted(x.text for x in lines if x.text.startswith("attempt 2 "))
        assert starts == [f"attempt 2 rank 0 start {STALL_AT}", f"attempt 2 rank 1 start {STALL_AT}"], \
            dn.why(lines, notes, final)
        out = tmp_path / "out"
        gtrain.pull(name, job_id=job.job_id, to=out)
        got = json.loads((out / "final.bin").read_text())
        assert got == {"step": STEPS, "w": reference(STEPS)}
    finally:
        gtrain.down(name, yes=True)
