"""The node's interruption-notice watcher: an IMDSv2 spot notice (a real HTTP server playing the metadata
endpoint) sends SIGUSR1 to the job's rank processes that handle it, and to nothing else."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from gtrain.checkpoints.node import watch_notices

RANK = """
import signal, sys, time, pathlib
out = pathlib.Path(sys.argv[1])
signal.signal(signal.SIGUSR1, lambda *a: out.write_text("checkpointed"))
print("ready", flush=True)
time.sleep(30)
"""


class IMDS(http.server.BaseHTTPRequestHandler):
    notice = False

    def do_PUT(self) -> None:  # noqa: N802
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"tok")

    def do_GET(self) -> None:  # noqa: N802
        ok = IMDS.notice and self.headers.get("X-aws-ec2-metadata-token") == "tok"
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b'{"action": "terminate", "time": "2026-01-01T00:00:00Z"}' if ok else b"")

    def log_message(self, *args: object) -> None:
        pass


def test_spot_notice_sends_sigusr1_to_ranks(tmp_path: Path, monkeypatch: object) -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), IMDS)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    env = {**os.environ, "GTRAIN_JOB_ID": "job-n", "LOCAL_RANK": "0"}
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(tmp_path / "r")], env=env, stdout=subprocess.PIPE)
    bystander = subprocess.Popen([sys.executable, "-c", RANK, str(tmp_path / "b")], stdout=subprocess.PIPE,
                                 env={**os.environ, "GTRAIN_JOB_ID": "other", "LOCAL_RANK": "0"})
    try:
        assert rank.stdout and rank.stdout.readline() and bystander.stdout and bystander.stdout.readline()
        os.environ["GTRAIN_IMDS_ENDPOINT"] = f"http://127.0.0.1:{srv.server_port}"
        os.environ["GTRAIN_GCE_METADATA_ENDPOINT"] = ""
        os.environ["GTRAIN_NOTICE_POLL_S"] = "0.1"
        stop = threading.Event()
        t = threading.Thread(target=watch_notices, args=("job-n", stop), daemon=True)
        t.start()
        time.sleep(0.5)
        assert not (tmp_path / "r").exists()  # no notice yet: nothing sent
        IMDS.notice = True
        t.join(timeout=10)
        deadline = time.time() + 5
        while not (tmp_path / "r").exists() and time.time() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "r").read_text() == "checkpointed"
        assert not (tmp_path / "b").exists() and bystander.poll() is None
    finally:
        for k in ("GTRAIN_IMDS_ENDPOINT", "GTRAIN_GCE_METADATA_ENDPOINT", "GTRAIN_NOTICE_POLL_S"):
            os.environ.pop(k, None)
        for p in (rank, bystander):
            p.kill()
            p.communicate()
        srv.shutdown()
        srv.server_close()
