"""End to end on a Cloud TPU slice (the fake TPU API v2, tests/fixtures/fake_tpu.py): `gtrain run` of a
``tpu-v4-16`` spec (2 worker hosts) makes the TPU node in the fake; each worker (``<node>-wN``) is reached
through ``gcp.ssh_proxy_command`` on a real sshd host (tests/fixtures/sshd.py), which gets the cluster's key from
the node's ``ssh-keys`` metadata as the TPU VM's guest environment would. JAX on CPU stands in for the chips: the
jax launcher starts one process per worker and ``jax.distributed`` joins them (a psum across the workers).
`run` tears the slice down and nothing is left in the fake; then an orphan slice (its state forgotten) is found
by its label by `gtrain gc --provider gcp` and deleted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import gtrain
from gtrain.context import Context
from gtrain.providers.gcp.provider import GCPProvider
from gtrain.remote import ssh as sshmod
from gtrain.state import StateStore
from tests.fixtures.fake_tpu import FakeTPU
from tests.integration.node_relay import relay_hosts

RELAY = Path(__file__).parent / "node_relay.py"
#: what a slice's program does first: every worker's process joins jax.distributed (gtrain's jax launcher
#: called initialize) and a psum runs across all of them
PSUM = """import jax, jax.numpy as jnp
n = jax.local_device_count()
total = jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(jnp.full((n,), jax.process_index() + 1.0))
print(f"jax process {jax.process_index()} of {jax.process_count()} devices {jax.device_count()} "
      f"psum {float(total[0])}", flush=True)
import os
print(f"env PJRT_DEVICE={os.environ.get('PJRT_DEVICE')} NODE_RANK={os.environ['GTRAIN_NODE_RANK']}", flush=True)
"""


@pytest.mark.slow
def test_run_jax_psum_on_a_two_worker_slice_then_gc_finds_an_orphan(fake_tpu: FakeTPU, ssh_hosts, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                     gtrain_home: Path) -> None:
    sshmod.close_all()
    relay_dir = tmp_path / "relay"
    hosts = relay_hosts(ssh_hosts, relay_dir)
    work = tmp_path / "work"
    work.mkdir()
    (work / "psum.py").write_text(PSUM)
    spec = tmp_path / "tpu-e2e.yaml"
    spec.write_text(json.dumps({
        "name": "tpu-e2e", "provider": "gcp",
        "resources": {"accelerators": "tpu-v4-16"},
        "gcp": {"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} tpu {relay_dir} %h",
                "ssh_timeout_s": 60, "poll_s": 0.2},
        "job": {"workdir": str(work), "run": "psum.py", "launcher": "jax", "python": sys.executable,
                "env": {"OMP_NUM_THREADS": "1", "JAX_PLATFORMS": "cpu"}},
    }))
    lines: list = []  # type: ignore[type-arg]
    res = gtrain.run(spec, on_line=lines.append, to=tmp_path / "pulled")
    texts = [ln.text for ln in lines]
    assert (res.status, res.exit_code) == ("succeeded", 0), texts[-30:]
    out = sorted(t for t in texts if t.startswith("jax process") and "psum" in t)
    assert [t.split(" devices")[0] for t in out] == ["jax process 0 of 2", "jax process 1 of 2"], texts[-30:]
    assert all(t.endswith("psum 3.0") for t in out)  # (0 + 1) + (1 + 1): both workers took part
    assert sorted(t for t in texts if t.startswith("env ")) == [f"env PJRT_DEVICE=TPU NODE_RANK={r}" for r in (0, 1)]
    mapping = json.loads((relay_dir / "map.json").read_text())
    cid = next(iter(mapping)).rsplit("-w", 1)[0]
    assert sorted(mapping) == [f"{cid}-w0", f"{cid}-w1"]  # each worker host reached by its own name
    assert fake_tpu.of_cluster(cid) == {"node": [], "queuedResource": []}  # run's down left nothing

    # an orphan: a slice whose state database is gone (a fresh GTRAIN_HOME); gc finds it by its label
    body = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base",
            "labels": {"gtrain-cluster": "orphan-0123abcd"}, "networkConfig": {"network": "global/networks/default"},
            "metadata": {"ssh-keys": "gtrain:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOrphan gtrain"}}
    import urllib.request

    req = urllib.request.Request(f"{fake_tpu.endpoint}/v2/projects/gtrain-test/locations/us-central2-b/nodes"
                                 "?nodeId=orphan-0123abcd", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": f"Bearer {fake_tpu.token}"})
    urllib.request.urlopen(req, timeout=10).close()
    provider = GCPProvider(StateStore(), Context(store=StateStore()).report)
    found = provider.gc(None, set(), delete=True)
    assert ("tpu-node", "orphan-0123abcd") in {(o.kind, o.cluster_id) for o in found.orphans}
    assert fake_tpu.of_cluster("orphan-0123abcd") == {"node": [], "queuedResource": []}


@pytest.mark.slow
def test_spot_slice_preempted_mid_run_is_recreated_and_resumes_from_the_store(  # type: ignore[no-untyped-def]
        fake_tpu: FakeTPU, moto_bridge: str, ssh_hosts, tmp_path: Path, gtrain_home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The slice's node becomes PREEMPTED (its workers' processes and connections die with it, as a TPU VM's
    do); the watcher (`gtrain wait`) learns it from the TPU API, remakes the whole slice (the same worker names,
    so the relay gives them the same hosts), relaunches under the same job id, every worker restores from the
    store, and the run ends with the weights of an uninterrupted one."""
    from tests.integration import durable_nodes as dn

    sshmod.close_all()
    monkeypatch.setenv("GTRAIN_WATCH_POLL_S", "1")
    relay_dir = tmp_path / "relay"
    hosts = relay_hosts(ssh_hosts, relay_dir)
    spec, store = dn.durable_spec(
        tmp_path, "tpuspot", moto_bridge, provider="gcp",
        resources={"accelerators": "tpu-v4-16", "use_spot": True},
        gcp={"ssh_user": hosts[0].user, "ssh_proxy_command": f"{sys.executable} {RELAY} tpu {relay_dir} %h",
             "ssh_timeout_s": 60, "poll_s": 0.2, "queued": True})
    notes = dn.Notes()
    res = gtrain.up(spec, report=notes)
    assert res.created and res.cluster is not None
    cid = res.cluster.id
    first = fake_tpu.nodes[f"projects/gtrain-test/locations/us-central2-b/nodes/{cid}"]["createTime"]
    preempted: dict[str, int] = {}
    try:
        job = gtrain.launch(spec, report=notes)

        def preempt() -> None:
            fake_tpu.preempt(cid)  # the TPU API says so; then every worker VM is gone with its processes
            preempted["killed"] = dn.kill9(dn.pids_where(
                lambda env, cmd: dn.of_node(job.job_id, 0)(env, cmd) or dn.of_node(job.job_id, 1)(env, cmd)
                or (b"node_relay.py" in cmd and f"{cid}-w".encode() in cmd)))

        killer = dn.when_in_store(store, dn.run_key(spec), "step-0003.pt", preempt)
        lines: list = []  # type: ignore[type-arg]
        final = gtrain.wait("tpuspot", job_id=job.job_id, on_line=lines.append, report=notes)
        killer.join(timeout=1)
        assert preempted.get("killed"), "the slice was never preempted"
        assert (final.status, final.exit_code) == ("succeeded", 0), dn.why(lines, notes, final)
        recs = final.info["recoveries"]
        assert len(recs) == 1 and recs[0]["kind"] == "preemption", recs
        assert recs[0]["lost"] == [0, 1] and recs[0]["reprovision"] == [0, 1] and "PREEMPTED" in recs[0]["detail"]
        node = fake_tpu.nodes[f"projects/gtrain-test/locations/us-central2-b/nodes/{cid}"]
        # a new slice (made after the first), through a new queued resource
        assert node["state"] == "READY" and node.get("queuedResource") and node["createTime"] > first
        pulled = gtrain.pull("tpuspot", job_id=job.job_id, to=tmp_path / "out")
        assert "final.pt" in pulled.transferred
        dn.check_resumed_same_weights(lines, tmp_path / "out" / "final.pt")
    finally:
        gtrain.down("tpuspot", yes=True)
    assert fake_tpu.of_cluster(cid) == {"node": [], "queuedResource": []}
