"""policies' limits on a Cloud TPU slice are held by the slice itself (the TPU API has no maxRunDuration): `up`
arms worker 0 -- a real sshd host (tests/fixtures/sshd.py) reached through gcp.ssh_proxy_command -- with the
time/cost lifetime (a detached ``sleep N && exec`` of the self-delete, N from policies.max_hours) and the idle
watch (policies.idle_minutes, 3 s here: nothing is launched, so it fires). When it fires, worker 0 takes a token
from the metadata server (a fake of GCE's, at the wire) and deletes the slice through the TPU API (a fake TPU
API v2 served where the hosts can reach it), so nothing keeps billing with no laptop and no gtrain process."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.remote import ssh as sshmod
from tests.fixtures.fake_tpu import FakeTPU, serve
from tests.integration.node_relay import relay_hosts

RELAY = Path(__file__).parent / "node_relay.py"
TOKEN = "ya29.worker-0-token-from-the-metadata-server"


class _Metadata(BaseHTTPRequestHandler):
    """GCE's metadata server, the one path the self-delete reads (https://cloud.google.com/compute/docs/access/
    authenticate-workloads#applications): the default service account's token, only with Metadata-Flavor."""

    asked: list[str] = []

    def log_message(self, *a: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        type(self).asked.append(self.path)
        ok = self.path == "/computeMetadata/v1/instance/service-accounts/default/token" and \
            self.headers.get("Metadata-Flavor") == "Google"
        body = json.dumps({"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"} if ok
                          else {"error": "Missing Metadata-Flavor:Google header or wrong path"}).encode()
        self.send_response(200 if ok else 403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def reachable(fake_tpu: FakeTPU, ssh_hosts: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeTPU]:
    """A fake TPU API and a metadata server on the hosts' bridge address (127.0.0.1 in loopback mode)."""
    addr = f"{ssh_hosts.subnet}.1" if ssh_hosts.mode == "netns" else "127.0.0.1"
    fake = FakeTPU()
    fake.tokens |= {*fake_tpu.tokens, TOKEN}  # gtrain's (the session's credentials) and worker 0's own
    api = serve(fake, addr)
    meta = ThreadingHTTPServer((addr, 0), _Metadata)
    meta.daemon_threads = True
    threading.Thread(target=meta.serve_forever, daemon=True).start()
    monkeypatch.setenv("CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU", f"{fake.endpoint}/")
    monkeypatch.setenv("GTRAIN_GCE_METADATA_ENDPOINT", f"http://{addr}:{meta.server_address[1]}")
    _Metadata.asked = []
    try:
        yield fake
    finally:
        api.shutdown()
        api.server_close()
        meta.shutdown()
        meta.server_close()


def _sleepers(marker: str) -> dict[int, list[str]]:
    """pid -> argv of the lifetime watches armed (``sh -c 'sleep N && exec ... marker ...'``)."""
    out = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{d}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv[:2] == ["sh", "-c"] and len(argv) > 2 and argv[2].startswith("sleep ") and marker in argv[2]:
            out[int(d)] = argv
    return out


@pytest.mark.slow
def test_worker_0_deletes_the_slice_itself_when_a_limit_fires(reachable: FakeTPU, ssh_hosts: Any, tmp_path: Path,
                                                              gtrain_home: Path) -> None:
    sshmod.close_all()
    relay_dir = tmp_path / "relay"
    hosts = relay_hosts(ssh_hosts, relay_dir)
    spec = tmp_path / "tpu-limits.yaml"
    spec.write_text(json.dumps({
        "name": "tpu-limits", "provider": "gcp", "resources": {"accelerators": "tpu-v4-16"},
        "policies": {"max_hours": 2, "idle_minutes": 0.05},
        "gcp": {"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} tpu {relay_dir} %h",
                "ssh_timeout_s": 60, "poll_s": 0.2}}))
    plan = gtrain.up(spec, dry_run=True).plan
    assert any("worker 0 deletes the slice" in n and "2.00 h" in n for n in plan.notes), plan.notes
    t0 = time.monotonic()
    res = gtrain.up(spec)
    assert res.cluster is not None
    cid = res.cluster.id
    node = f"projects/gtrain-test/locations/us-central2-b/nodes/{cid}"
    sleepers = _sleepers(f"nodes/{cid}")
    try:
        # the time limit: one watch, on worker 0 only, sleeping the whole 2 h, then the self-delete of this node
        assert len(sleepers) == 1, sleepers
        line = next(iter(sleepers.values()))[2]
        assert line.startswith("sleep 7200 && exec ") and ".gtrain-tpu-self-delete.py" in line, line
        assert reachable.endpoint in line and f"{node} -" in line and TOKEN not in line  # no token in argv
        # the idle watch (3 s, nothing launched) fires first: worker 0 deletes the slice with its own token
        deadline = time.monotonic() + 60
        while reachable.of_cluster(cid)["node"] and time.monotonic() < deadline:
            time.sleep(0.2)
        took = time.monotonic() - t0
        assert reachable.of_cluster(cid) == {"node": [], "queuedResource": []}, reachable.deletes
        assert (f"/v2/{node}", f"Bearer {TOKEN}") in reachable.deletes, reachable.deletes
        assert _Metadata.asked == ["/computeMetadata/v1/instance/service-accounts/default/token"]
        print(f"slice deleted by its worker 0 {took:.1f}s after `up` began (idle_minutes 0.05)")
    finally:
        for pid in _sleepers(f"nodes/{cid}"):
            os.kill(pid, 9)
        gtrain.down("tpu-limits", yes=True)
    assert reachable.of_cluster(cid) == {"node": [], "queuedResource": []}


def test_the_self_delete_of_a_queued_slice(fake_tpu: FakeTPU, tmp_path: Path) -> None:
    """The script as worker 0 runs it (python3, stdlib only), on a queued slice: the metadata server's token on
    both DELETEs, the queued resource first with force=true (its node goes with it), the node's 404 taken as
    done; a metadata server that refuses is retried, not a delete without a token."""
    import subprocess
    import urllib.request

    from gtrain.providers.gcp.tpu import selfdelete
    from gtrain.providers.gcp.tpu.limits import SCRIPT

    meta = ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=meta.serve_forever, daemon=True).start()
    parent = "projects/gtrain-test/locations/us-central2-b"
    body = {"tpu": {"nodeSpec": [{"parent": parent, "nodeId": "selfdel-q", "node": {
        "acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base", "labels": {"gtrain-cluster": "selfdel-q"},
        "networkConfig": {"network": "global/networks/default"},
        "metadata": {"ssh-keys": "gtrain:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAISelfDelete gtrain"}}}]}, "guaranteed": {}}
    fake_tpu.tokens.add(TOKEN)  # the metadata server's, which the self-delete sends
    req = urllib.request.Request(f"{fake_tpu.endpoint}/v2/{parent}/queuedResources?queuedResourceId=selfdel-q",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    urllib.request.urlopen(req, timeout=10).close()
    deadline = time.monotonic() + 10
    while not fake_tpu.of_cluster("selfdel-q")["node"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fake_tpu.of_cluster("selfdel-q")["node"], "the fake made no node for the queued resource"
    before = len(fake_tpu.deletes)
    _Metadata.asked = []
    try:
        r = subprocess.run([sys.executable, "-I", str(SCRIPT), fake_tpu.endpoint + "/",
                            f"http://127.0.0.1:{meta.server_address[1]}", f"{parent}/nodes/selfdel-q",
                            f"{parent}/queuedResources/selfdel-q"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        sent = fake_tpu.deletes[before:]
        assert sent == [(f"/v2/{parent}/queuedResources/selfdel-q", f"Bearer {TOKEN}"),
                        (f"/v2/{parent}/nodes/selfdel-q", f"Bearer {TOKEN}")], sent
        assert "already gone" in r.stdout or "deleting" in r.stdout, r.stdout
        deadline = time.monotonic() + 10
        while fake_tpu.of_cluster("selfdel-q") != {"node": [], "queuedResource": []} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fake_tpu.of_cluster("selfdel-q") == {"node": [], "queuedResource": []}
        # the wrong metadata path (no token there): retried, never a DELETE without one
        selfdelete.RETRY_S = 0
        assert selfdelete.main([fake_tpu.endpoint, f"http://127.0.0.1:{meta.server_address[1]}/nope",
                                f"{parent}/nodes/x", "-"]) == 1
        assert len(fake_tpu.deletes) == before + 2
    finally:
        selfdelete.RETRY_S = 600
        meta.shutdown()
        meta.server_close()
