"""A failing 2-node local run sends exactly one `failed` message, with the failing rank's last lines, to a real
local HTTP server standing in for a Slack webhook -- even when two followers wait on the job; `gtrain notify
test` reaches every target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gtrain
from tests.notify_receivers import webhook

FAIL = """import os, sys, time
rank = int(os.environ["GTRAIN_NODE_RANK"])
if rank == 1:
    for i in range(30):
        print(f"rank1 step {i}", flush=True)
    print("RuntimeError: CUDA out of memory (the token is " + os.environ["HOOK_TOKEN"] + ")", flush=True)
    sys.exit(3)
time.sleep(60)
"""


def _spec(tmp: Path, name: str, run: str) -> Path:
    (tmp / "fail.py").write_text(FAIL)
    spec = {"name": name, "provider": "local", "num_nodes": 2,
            "job": {"workdir": str(tmp), "run": run, "launcher": "python", "nproc_per_node": 1,
                    "secrets": ["HOOK_TOKEN"], "env": {"OMP_NUM_THREADS": "1"}},
            "notify": {"on": ["failed", "succeeded"], "webhook": {"url_secret": "TEST_SLACK_URL", "format": "slack"},
                       "command": f"{sys.executable} -c 'import sys; open(sys.argv[1], \"a\").write(sys.stdin.read()"
                                  f" + \"\\n\")' {tmp / 'events.jsonl'}"}}
    p = tmp / "spec.yaml"
    p.write_text(json.dumps(spec))
    return p


def test_failing_two_node_run_sends_one_failed_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_NOTIFY_BACKOFF_S", "0.01")
    monkeypatch.setenv("HOOK_TOKEN", "tok-9f8e7d6c5b4a")
    monkeypatch.setenv("GTRAIN_RAPL_DIR", str(tmp_path / "no-powercap"))  # no power readings, whatever the host
    spec = _spec(tmp_path, "notify-fail", "fail.py")
    with webhook([500]) as hook:  # the first try fails: retried, delivered once
        monkeypatch.setenv("TEST_SLACK_URL", hook.url)
        gtrain.up(spec)
        try:
            gtrain.launch(spec)
            first = gtrain.wait("notify-fail")
            second = gtrain.wait("notify-fail")  # another follower of the same job: no second message
        finally:
            gone = gtrain.down("notify-fail")
    energy = gone.cost.energy  # CPU nodes: said, never 0 kWh
    assert energy is not None and energy["kwh"] is None and energy["note"].startswith("no energy data")
    assert first.status == "failed" and first.exit_code == 3 and second.status == "failed"
    assert len(hook.delivered) == 1, hook.requests
    body = hook.delivered[0]
    assert "FAILED" in body["text"] and "notify-fail" in body["text"]
    code = body["blocks"][-1]["text"]["text"]
    assert "rank1 step 29" in code and "CUDA out of memory" in code
    assert "tok-9f8e7d6c5b4a" not in json.dumps(body)  # a job secret in the last lines is masked
    events = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["failed"]
    assert events[0]["failed"]["node"] == 1 and events[0]["exit_code"] == 3 and events[0]["cost_usd"] is not None


def test_notify_test_cli_reaches_every_target(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "notify-cli", "fail.py")
    with webhook() as hook:
        env = {**os.environ, "TEST_SLACK_URL": hook.url, "GTRAIN_NOTIFY_BACKOFF_S": "0.01"}
        r = subprocess.run([sys.executable, "-m", "gtrain", "notify", "test", str(spec), "--json"],
                           capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [t["ok"] for t in doc["targets"]] == [True, True]
    assert "s3cr3t-token" not in r.stdout + r.stderr
    assert len(hook.delivered) == 1 and "test message" in hook.delivered[0]["text"]
    r = subprocess.run([sys.executable, "-m", "gtrain", "notify", "test", str(spec)], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "TEST_SLACK_URL": ""})
    assert r.returncode == 1 and "TEST_SLACK_URL is not set" in r.stderr


FLAKY = ("import os, sys\nprint('attempt=' + os.environ.get('GTRAIN_ATTEMPT', 'unset'), flush=True)\n"
         "sys.exit(137 if os.environ.get('GTRAIN_ATTEMPT') == '1' else 0)\n")


def test_recovery_sends_preempted_then_recovered_then_succeeded(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    monkeypatch.setenv("GTRAIN_NOTIFY_BACKOFF_S", "0.01")
    (tmp_path / "flaky.py").write_text(FLAKY)
    spec = tmp_path / "rec.yaml"
    spec.write_text(json.dumps({
        "name": "notify-rec", "provider": "local", "num_nodes": 1,
        "job": {"workdir": str(tmp_path), "run": "flaky.py", "nproc_per_node": 1, "python": sys.executable,
                "launcher": "python"},
        "policies": {"recovery": {"max_restarts": 2, "backoff_s": 0, "on": [{"exit_codes": [137]}]}},
        "notify": {"webhook": {"url_secret": "TEST_HOOK_URL", "format": "discord"}}}))
    with webhook(ok_status=204) as hook:  # Discord answers 204 No Content
        monkeypatch.setenv("TEST_HOOK_URL", hook.url)
        res = gtrain.run(spec, to=tmp_path / "out")
    assert res.exit_code == 0 and len(res.recoveries) == 1
    titles = [b["embeds"][0]["title"] for b in hook.delivered]
    assert [t.rsplit(" ", 2)[-2:] for t in titles] == [["was", "preempted"], ["notify-rec", "recovered"],
                                                      ["notify-rec", "succeeded"]], titles


def test_budget_80_and_reached_are_sent_once_when_the_cost_so_far_reaches_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `fake` plug-in provider bills $0.50/h per node; a cap of $0.0001 is spent within a second."""
    from gtrain.context import Context
    from gtrain.runs.follow import budget_check
    from tests.fake_provider import installed

    monkeypatch.setenv("GTRAIN_NOTIFY_BACKOFF_S", "0.01")
    spec = tmp_path / "b.yaml"
    spec.write_text(json.dumps({"name": "notify-budget", "provider": "fake", "num_nodes": 2, "fake": {},
                                "policies": {"max_cost_usd": 0.0001},
                                "notify": {"webhook": {"url_secret": "TEST_HOOK_URL", "format": "json"}}}))
    with installed(tmp_path / "cloud"), webhook() as hook:
        monkeypatch.setenv("TEST_HOOK_URL", hook.url)
        gtrain.up(spec)
        try:
            ctx = Context()
            cluster = ctx.cluster("notify-budget")
            ctx.store.create_job(cluster.id, "notify-budget-job", {})
            job = ctx.store.get_job("notify-budget-job")
            deadline = time.time() + 30
            while (share := budget_check(cluster, job, ctx)) is not None and share < 1.0 and time.time() < deadline:
                time.sleep(0.2)
            assert share is not None and share >= 1.0
            budget_check(cluster, job, ctx)  # again: no second message
            ctx.store.close()
        finally:
            gtrain.down("notify-budget", yes=True)
    assert [b["event"] for b in hook.delivered] == ["budget_80", "budget_reached"]
    assert "policies.max_cost_usd" in hook.delivered[0]["detail"] and hook.delivered[0]["cost_usd"] is not None
