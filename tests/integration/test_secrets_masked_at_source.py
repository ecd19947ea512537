"""Issue 40: a secret the job prints is masked on the node, before a byte reaches its log files, in raw, base64,
urlsafe base64, hex, URL-encoded and JSON-escaped forms; so ``gtrain logs -f`` from a shell WITHOUT the secret
(the CI flow), ``logs``, ``exec cat`` of the node's log files and the run archive never hold any of them."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

SECRET = 'Zq9sEc"ReT/v4lu3+x y'
TRAIN = """import os, sys, time, base64, binascii, urllib.parse, json
s = os.environ["MYSEC"]
raw = s.encode()
print("raw", s, flush=True)
print("b64", base64.b64encode(raw).decode(), flush=True)
sys.stdout.write("url64 " + base64.urlsafe_b64encode(raw).decode()[:7]); sys.stdout.flush(); time.sleep(0.2)
print(base64.urlsafe_b64encode(raw).decode()[7:], flush=True)  # one form split over two writes
print("hex", binascii.hexlify(raw).decode(), file=sys.stderr, flush=True)
print("pct", urllib.parse.quote(s, safe=""), flush=True)
print("json", json.dumps({"k": s}), flush=True)
sys.stdout.write("\\rprogress 50%\\rprogress 100%\\n"); sys.stdout.flush()
print("done", flush=True)
"""


def _forms() -> list[str]:
    raw = SECRET.encode()
    return [SECRET, base64.b64encode(raw).decode().rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("="),
            raw.hex(), urllib.parse.quote(SECRET, safe=""), json.dumps(SECRET)[1:-1]]


def _gtrain(*args: str, cwd: Path, secret: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MYSEC"}
    if secret:
        env["MYSEC"] = SECRET
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL, env=env, cwd=cwd)


def _clean(text: str, what: str) -> None:
    for form in _forms():
        assert form not in text, (what, form, text[-2000:])


@pytest.mark.parametrize("provider", ["local", "ssh"])
def test_job_secret_masked_on_the_node(provider: str, request: pytest.FixtureRequest, tmp_path: Path,
                                       gtrain_home: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    (work / "setup_print.py").write_text(TRAIN.replace('print("done", flush=True)', 'print("setup done", flush=True)'))
    cfg: dict[str, object] = {"name": f"src-{provider}", "provider": provider, "num_nodes": 1,
                              "job": {"workdir": str(work), "run": "train.py", "secrets": ["MYSEC"],
                                      "setup": "python3 setup_print.py",  # job.setup's output, streamed at launch
                                      "env": {"OMP_NUM_THREADS": "1"}}}
    if provider == "ssh":
        from gtrain.remote import ssh as sshmod

        sshmod.close_all()
        h = request.getfixturevalue("ssh_hosts")[0]
        cfg["ssh"] = {"user": h.user, "identity_file": h.identity_file, "python": sys.executable,
                      "hosts": [f"{h.address}:{h.port}"], "host_keys": {f"{h.address}:{h.port}": h.host_key_line}}
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps(cfg))
    name = str(cfg["name"])
    try:
        r = _gtrain("up", str(spec), cwd=tmp_path, secret=False)
        assert r.returncode == 0, r.stderr[-3000:]
        r = _gtrain("launch", str(spec), cwd=tmp_path, secret=True)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "setup done" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
        _clean(r.stdout + r.stderr, "launch (job.setup's output)")
        follow = _gtrain("logs", name, "-f", cwd=tmp_path, secret=False)  # the CI flow: no secret here
        out = follow.stdout + follow.stderr
        assert "raw ***" in out and "done" in out and "progress 100%" in out, out[-3000:]
        _clean(out, "logs -f")
        _clean(_gtrain("logs", name, cwd=tmp_path, secret=False).stdout, "logs")
        for log in ("logs/rank-0.log", "node.log"):
            r = _gtrain("exec", name, "--", "sh", "-c", f'cat "$GTRAIN_WORKDIR/../jobs/"*/{log}', cwd=tmp_path,
                        secret=False)
            assert log == "node.log" or "hex ***" in r.stdout, r.stdout + r.stderr
            _clean(r.stdout + r.stderr, f"exec cat {log}")
    finally:
        _gtrain("down", name, cwd=tmp_path, secret=False)
    kept = [p for p in gtrain_home.rglob("*") if p.is_file()]
    assert kept
    for p in kept:
        data = p.read_bytes()
        for form in _forms():
            assert form.encode() not in data, (p, form)


def test_ray_job_secret_masked_and_not_in_the_jobs_api(ray_cluster: object, tmp_path: Path) -> None:
    """Ray: none of the 6 forms in gtrain's output, the Jobs API's answers (job info, runtime_env, entrypoint)
    or Ray's session logs; the secrets travel in a one-off GCS package the driver deletes once read."""
    import urllib.request

    from tests.integration.test_ray import cli, spec

    address = str(ray_cluster.address)  # type: ignore[attr-defined]
    path = spec(tmp_path, "ray-mask", "mask_train.py", address, num_nodes=1)
    (tmp_path / "work" / "mask_train.py").write_text(TRAIN.replace('"MYSEC"', '"RAY_TEST_TOKEN"'))
    res = cli(tmp_path, "run", path, "--no-report", "--to", str(tmp_path / "pulled"),
              env={"RAY_TEST_TOKEN": SECRET})
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "raw ***" in out and "hex ***" in out, out[-4000:]
    _clean(out, "run")
    with urllib.request.urlopen(f"{address.rstrip('/')}/api/jobs/", timeout=30) as r:
        _clean(r.read().decode(), "Jobs API")
    root = Path(str(ray_cluster.root))  # type: ignore[attr-defined]
    for p in [*root.rglob("*.log"), *root.rglob("*.out"), *root.rglob("*.err"), *(tmp_path / "home").rglob("*")]:
        if p.is_file():
            data = p.read_bytes()
            for form in _forms():
                assert form.encode() not in data, (p, form)


def test_a_process_the_rank_leaves_behind_does_not_hold_the_jobs_end(tmp_path: Path, gtrain_home: Path) -> None:
    """The rank starts a background process that keeps its stdout and exits 0: the masking filter would wait for
    that writer for ever; the rank's end is recorded, and the job succeeds, within seconds all the same."""
    import time

    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("import os, subprocess\nprint('raw', os.environ['MYSEC'], flush=True)\n"
                                   "subprocess.Popen(['sleep', '127.25'])  # inherits stdout and outlives the rank\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"name": "src-linger", "provider": "local", "num_nodes": 1,
                                "job": {"workdir": str(work), "run": "train.py", "secrets": ["MYSEC"]}}))
    try:
        assert _gtrain("up", str(spec), cwd=tmp_path, secret=False).returncode == 0
        t0 = time.monotonic()
        r = _gtrain("launch", str(spec), "--wait", cwd=tmp_path, secret=True)
        took = time.monotonic() - t0
        assert r.returncode == 0 and "raw ***" in r.stdout + r.stderr, r.stderr[-3000:]
        assert took < 60, took
    finally:
        _gtrain("down", "src-linger", cwd=tmp_path, secret=False)
        subprocess.run(["pkill", "-f", "sleep 127.25"], check=False)


def test_ray_checkpoint_tool_secrets_not_in_the_jobs_api_or_rays_logs(ray_cluster: object, moto_server: str,
                                                                     tmp_path: Path) -> None:
    """Ray, the checkpoint tool's own Ray jobs (the store's write probe at launch, gtrain.providers.ray.execjob):
    the store's credentials (job.secrets) reach the tool on its stdin through a one-off GCS package the
    entrypoint deletes once read, never the exec job's runtime_env (the Jobs API and Ray's logs showed them),
    and the tool's output is masked before Ray stores it."""
    import urllib.request

    import yaml

    from tests.integration.test_ray import bucket, cli, spec

    address = str(ray_cluster.address)  # type: ignore[attr-defined]
    store = bucket("ray-exec-mask")
    path = Path(spec(tmp_path, "ray-exec-mask", "ok.py", address, num_nodes=1))
    (tmp_path / "work" / "ok.py").write_text(  # one checkpoint for the store: `run` pulls it and goes down
        "import os\nos.makedirs('ckpt', exist_ok=True)\nopen('ckpt/step-0001.pt', 'wb').write(b'w' * 64)\n"
        "print('done', flush=True)\n")
    doc = yaml.safe_load(path.read_text())
    doc["job"].update({"checkpoint_dir": "ckpt", "checkpoint_store": store, "nproc_per_node": 1,
                       "secrets": ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"],
                       "env": {"OMP_NUM_THREADS": "1", "AWS_ENDPOINT_URL": moto_server,
                               "AWS_DEFAULT_REGION": "us-east-1"}})
    path.write_text(yaml.safe_dump(doc))
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:  # the Jobs API while the tool's Ray jobs exist (each is deleted once read)
        while not stop.is_set():
            try:
                with urllib.request.urlopen(f"{address.rstrip('/')}/api/jobs/", timeout=5) as r:
                    seen.append(r.read().decode())
            except OSError:
                pass
            stop.wait(0.2)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        res = cli(tmp_path, "run", str(path), "--no-report", "--to", str(tmp_path / "pulled"),
                  env={"AWS_SECRET_ACCESS_KEY": SECRET})
    finally:
        stop.set()
        t.join(10)
        cli(tmp_path, "down", "ray-exec-mask", "--yes")
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "writable from every node" in out and "done" in out, out[-4000:]
    assert any("gtrain-exec-" in s for s in seen), "the Jobs API never showed the tool's Ray job"
    _clean(out, "run")
    for i, answer in enumerate(seen):
        _clean(answer, f"Jobs API answer {i}")
    root = Path(str(ray_cluster.root))  # type: ignore[attr-defined]
    for p in [*root.rglob("*.log"), *root.rglob("*.out"), *root.rglob("*.err"), *(tmp_path / "home").rglob("*")]:
        if p.is_file():
            data = p.read_bytes()
            for form in _forms():
                assert form.encode() not in data, (p, form)
