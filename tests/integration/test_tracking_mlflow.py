"""A real MLflow tracking server (sqlite backend) holds one parent run per job, with the metrics
`gtrain.metrics.log` wrote, under the same run id across a recovery."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import gtrain

SCRIPT = """import os, sys
import gtrain.metrics
attempt = int(os.environ.get("GTRAIN_ATTEMPT", "0"))
print("mlflow_run=" + os.environ.get("MLFLOW_RUN_ID", "unset"), flush=True)
gtrain.metrics.log(step=attempt, loss=1.0 / attempt)
gtrain.metrics.flush()
sys.exit(137 if attempt == 1 else 0)
"""


def _api(base: str, path: str, body: dict | None = None) -> dict:  # type: ignore[type-arg]
    req = urllib.request.Request(f"{base}/api/2.0/mlflow/{path}", method="GET" if body is None else "POST",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"{}")  # type: ignore[no-any-return]


# The tracking server: MLflow's own server app (mlflow.server.app, what `mlflow server` serves) with a sqlite
# backend store, served by werkzeug in one process -- `mlflow server` starts uvicorn workers that import mlflow
# again, which doubled the start-up on a loaded machine.
SERVER = """import os, sys
os.environ["_MLFLOW_SERVER_FILE_STORE"] = sys.argv[1]
os.environ["_MLFLOW_SERVER_ARTIFACT_ROOT"] = sys.argv[2]
from mlflow.server import app
from werkzeug.serving import make_server
make_server("127.0.0.1", int(sys.argv[3]), app, threaded=True).serve_forever()
"""


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("mlflow")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(d / "server.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", SERVER, f"sqlite:///{d}/mlflow.db", str(d / "artifacts"),
                                 str(port)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail("mlflow server did not start: " + (d / "server.log").read_text()[-2000:])
            time.sleep(0.3)
        yield base
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)


def test_one_parent_run_per_job_same_run_across_a_recovery(mlflow_server: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    (tmp_path / "train.py").write_text(SCRIPT)
    spec = tmp_path / "ml.yaml"
    spec.write_text(json.dumps({
        "name": "mlflow-rec", "provider": "local", "num_nodes": 1,
        "job": {"workdir": str(tmp_path), "run": "train.py", "nproc_per_node": 1, "python": sys.executable,
                "launcher": "python",
                "tracking": {"mlflow": {"tracking_uri": mlflow_server, "experiment": "gtrain-test"},
                             "forward_metrics": True}},
        "policies": {"recovery": {"max_restarts": 2, "backoff_s": 0, "on": [{"exit_codes": [137]}]}}}))
    lines: list[str] = []
    res = gtrain.run(spec, to=tmp_path / "out", on_line=lambda ln: lines.append(ln.text))
    assert res.exit_code == 0 and len(res.recoveries) == 1
    said = {ln.split("=", 1)[1] for ln in lines if ln.startswith("mlflow_run=")}
    exp = _api(mlflow_server, "experiments/get-by-name?experiment_name=gtrain-test")["experiment"]["experiment_id"]
    runs = _api(mlflow_server, "runs/search", {"experiment_ids": [exp]})["runs"]
    assert len(runs) == 1, runs
    info = runs[0]["info"]
    assert said == {info["run_id"]}  # both attempts logged to the job's one run
    assert info["run_name"] == res.job_id and info["status"] == "FINISHED"
    hist = _api(mlflow_server, f"metrics/get-history?run_id={info['run_id']}&metric_key=loss")["metrics"]
    assert sorted((m["step"], m["value"]) for m in hist) == [(1, 1.0), (2, 0.5)]
