"""A closed laptop still gets its message: on an AWS cluster (moto; the node is a real sshd host reached through
``aws.ssh_proxy_command``), rank 0's own watcher sends ``idle_stopped`` when ``policies.idle_minutes`` powers
the node off -- exactly one message, from the node, to a real HTTP server -- and the webhook URL (a secret) is
in no process's argv or environment, no file of the node's home or of gtrain's home, and no log."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

import gtrain
from gtrain.remote import ssh as sshmod
from tests.integration.node_relay import relay_hosts
from tests.notify_receivers import webhook
from tests.procscan import procs_holding

RELAY = Path(__file__).parent / "node_relay.py"


def _in_procs(needle: bytes) -> list[str]:
    """Processes whose argv (any) or environment (but the laptop's: this one and the ProxyCommand relays it
    starts inherit the user's environment, which holds the secret by design) holds ``needle``."""
    return procs_holding(needle, laptops_env=lambda argv: b"node_relay.py" in argv)


def _in_files(root: Path, needle: bytes) -> list[str]:
    out = []
    for p in root.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink() and needle in p.read_bytes():
                out.append(str(p))
        except OSError:
            continue
    return out


def test_the_node_sends_idle_stopped_itself_once_and_keeps_its_secret_in_memory(  # type: ignore[no-untyped-def]
        moto_server: str, ssh_hosts, tmp_path: Path, gtrain_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sshmod.close_all()
    monkeypatch.setenv("GTRAIN_NOTIFY_BACKOFF_S", "0.01")
    relay_dir = tmp_path / "relay"
    hosts = relay_hosts(ssh_hosts, relay_dir)
    listen = f"{ssh_hosts.subnet}.1" if ssh_hosts.mode == "netns" else "127.0.0.1"  # reachable from the node
    spec = tmp_path / "nn.yaml"
    spec.write_text(json.dumps({
        "name": "notify-node", "provider": "aws", "num_nodes": 1,
        "resources": {"accelerators": "T4:1", "region": "us-east-1", "disk_gb": 50},
        "aws": {"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} aws {relay_dir} %h",
                "host_key_wait_s": 0, "ssh_timeout_s": 60, "poll_s": 0.2,
                "idle_command": ["sh", "-c", f"mktemp {tmp_path}/idle-fired.XXXXXX"]},  # not a real power-off
        "policies": {"idle_minutes": 0.05},
        "notify": {"webhook": {"url_secret": "NODE_HOOK_URL", "format": "discord"}}}))
    with webhook([502], host=listen) as hook:  # the node retries its first failed try
        secret = hook.url.encode()
        monkeypatch.setenv("NODE_HOOK_URL", hook.url)
        up = gtrain.up(spec)
        assert up.cluster is not None
        monkeypatch.delenv("NODE_HOOK_URL")  # from here on only the node has it
        try:
            deadline, seen = time.monotonic() + 30, 0
            while not (hook.delivered and list(tmp_path.glob("idle-fired.*"))):
                assert time.monotonic() < deadline, (hook.requests, list(tmp_path.glob("idle-fired.*")))
                seen += len(_in_procs(b"gtrain.notify.nodewatch"))  # the node's watcher, by its argv
                assert not _in_procs(secret), "the webhook URL is in a process's argv or environment"
                time.sleep(0.2)
            assert seen, "the node's watcher was never seen running"
            time.sleep(1.0)  # nothing more comes
            assert [b["embeds"][0]["title"] for b in hook.delivered] == [
                f"gtrain: job - on notify-node {'was stopped: GPUs idle'}"], hook.requests
            assert [r["status"] for r in hook.requests] == [502, 200]
            assert "policies.idle_minutes" in json.dumps(hook.delivered[0])
            homes = [h.home for h in ssh_hosts] if ssh_hosts.mode == "netns" else [Path.home()]
            marks = [p for h in homes for p in h.rglob("idle_stopped-*.json") if p.parent.name == "notify-node"]
            assert len(marks) == 1 and json.loads(marks[0].read_text())["outcomes"][0]["ok"] is True
            for root in [*homes, gtrain_home, tmp_path]:  # the node log is in its home
                assert not _in_files(root, secret), root

            # the laptop's side of the markers, over SSH: an event the node claimed is not sent again by a
            # follower; one the follower sends first is marked on the node, so the node's watcher will not
            from gtrain.context import Context
            from gtrain.notify.nodestart import claim_on
            from gtrain.runs.notify import notify_job

            monkeypatch.setenv("NODE_HOOK_URL", hook.url)
            ctx = Context()
            cluster = ctx.cluster("notify-node")
            ctx.store.create_job(cluster.id, "notify-node-job", {})
            job = ctx.store.get_job("notify-node-job")
            node0 = ctx.runners(cluster)[0]
            assert claim_on(node0, "notify-node", "budget_80") is True  # as the node's watcher claims it
            assert notify_job(cluster, job, ctx, "budget_80") is None
            sent = notify_job(cluster, job, ctx, "budget_reached", detail="the follower saw it first")
            assert sent is not None and [o.ok for o in sent] == [True]
            assert claim_on(node0, "notify-node", "budget_reached") is False  # the node's watcher finds it
            assert [b["embeds"][0]["title"].rsplit(" ", 3)[-3:] for b in hook.delivered[1:]] == [
                ["reached", "its", "budget"]]
            ctx.store.close()
        finally:
            gtrain.down("notify-node", yes=True)
