"""`gtrain attach NAME --provider runpod|vast|nebius` after the home that ran `up` is deleted, each on its fake
(tests/fixtures/fake_runpod.py, fake_vast.py, fake_nebius.py), the nodes real sshd hosts (tests/fixtures/sshd.py)
holding the cluster's key only, which is the team's (GTRAIN_SSH_KEY, the same file on both machines). Machine a
(GTRAIN_HOME a) runs `up` + `launch`; machine b (GTRAIN_HOME b, nothing local) attaches by the resources' tags,
rebuilds the job from node 0's record, follows it, reads its logs and tears it down: nothing is left on the fake.
Also: a name nothing is tagged with is one line and exit 2; an attach without the cluster's key makes nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gtrain
from gtrain.context import Context
from gtrain.errors import ConfigError
from gtrain.providers.cloud.keys import generate_key
from gtrain.remote import ssh as sshmod
from gtrain.runs.attach import attach
from gtrain.spec import load_spec
from gtrain.state import StateStore
from tests.fixtures.fake_nebius import PROJECT, SUBNET, FakeNebius
from tests.fixtures.fake_runpod import FakeRunPod
from tests.fixtures.fake_vast import FakeVast

JOB = "import os\nprint('adopted rank', os.environ['RANK'], flush=True)\n"


def two_hosts(ssh_hosts: Any) -> list[Any]:
    return [ssh_hosts[2], ssh_hosts[3]] if len(ssh_hosts) >= 4 else [ssh_hosts[0], ssh_hosts[1]]


def machine_a(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, doc: dict[str, Any]) -> Path:
    """The team's key in GTRAIN_SSH_KEY, GTRAIN_HOME a, the job and the spec file written; the spec's path."""
    sshmod.close_all()
    team = tmp_path / "team" / "id_ed25519"
    team.parent.mkdir(mode=0o700)
    generate_key(team)
    monkeypatch.setenv("GTRAIN_SSH_KEY", str(team))
    monkeypatch.setenv("GTRAIN_HOME", str(tmp_path / "a"))
    monkeypatch.setenv("NO_COLOR", "1")
    work = tmp_path / "work"
    work.mkdir()
    (work / "job.py").write_text(JOB)
    doc["job"] = {"workdir": str(work), "run": "job.py", "nproc_per_node": 1, "python": sys.executable,
                  "launcher": "python"}
    path = tmp_path / f"{doc['name']}.yaml"
    path.write_text(json.dumps(doc))
    return path


def up_on_a_attach_on_b(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: Path, provider: str,
                        regions: list[str], num_nodes: int) -> str:
    """`up` + `launch` on a, a deleted, attach on b, then wait / logs / down from b; the cluster id."""
    name = load_spec(str(spec)).name
    res = gtrain.up(spec)
    assert res.cluster is not None
    cid = res.cluster.id
    job = gtrain.launch(spec)
    sshmod.close_all()
    shutil.rmtree(tmp_path / "a")
    monkeypatch.setenv("GTRAIN_HOME", str(tmp_path / "b"))
    try:
        ctx = Context()
        try:
            got = attach(ctx, name, provider, regions, load_spec(str(spec)))
            nodes = ctx.store.node_records(cid)
            assert got.id == cid and got.status == "up" and [n.rank for n in nodes] == list(range(num_nodes))
            assert [j.id for j in ctx.store.jobs(cid)] == [job.job_id]
            assert got.price_per_hour > 0 and all(n.launched_at < got.extra["attached_at"] for n in nodes)
        finally:
            ctx.store.close()
        lines: list[Any] = []
        final = gtrain.wait(name, on_line=lines.append)
        texts = [ln.text for ln in lines]
        assert (final.status, final.exit_code) == ("succeeded", 0), texts[-20:]
        assert sorted(t for t in texts if t.startswith("adopted")) == [f"adopted rank {r}" for r in range(num_nodes)]
        again: list[Any] = []
        gtrain.logs(name, on_line=again.append)
        assert any(ln.text == "adopted rank 0" for ln in again), [ln.text for ln in again][-20:]
        (row,) = gtrain.status(name)
        assert [n["status"] for n in row["nodes"]] == ["running"] * num_nodes, row
    finally:
        down = gtrain.down(name)
    assert sorted(ln.node_rank for ln in down.cost.lines) == list(range(num_nodes))
    assert all((ln.note or "").startswith("reconstructed by gtrain attach") for ln in down.cost.lines)
    return cid


def test_attach_runpod_instant_cluster_by_name_and_env_tag(fake_runpod: FakeRunPod, ssh_hosts: Any,  # type: ignore[no-untyped-def]
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = two_hosts(ssh_hosts)
    fake_runpod.use_hosts(hosts)
    spec = machine_a(tmp_path, monkeypatch, {
        "name": "adoptrp", "provider": "runpod", "num_nodes": 2,
        "resources": {"accelerators": "H100:8", "region": "US-TX-3"},
        "runpod": {"ssh_user": hosts[0].user, "ssh_timeout_s": 30, "poll_s": 0.1}})
    cid = up_on_a_attach_on_b(tmp_path, monkeypatch, spec, "runpod", ["US-TX-3"], 2)
    with fake_runpod.lock:
        fake_runpod._tick()
        left = [p["name"] for p in fake_runpod.pods.values() if p["status"] != "TERMINATED"]
    assert not [n for n in left if n.startswith(f"gtrain-{cid}")], left
    assert not [c for c in fake_runpod.clusters.values() if c["name"] == f"gtrain-{cid}" and not c.get("_deleted")]


def test_attach_vast_by_label_and_without_the_key_makes_nothing(fake_vast: FakeVast, ssh_hosts: Any,  # type: ignore[no-untyped-def]
                                                                tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = two_hosts(ssh_hosts)
    fake_vast.use_hosts(hosts)
    spec = machine_a(tmp_path, monkeypatch, {
        "name": "adoptva", "provider": "vast", "num_nodes": 1, "resources": {"accelerators": "RTX4090:1"},
        "vast": {"ssh_user": hosts[0].user, "ssh_timeout_s": 30, "poll_s": 0.1}})
    res = gtrain.up(spec)
    assert res.cluster is not None
    cid = res.cluster.id
    monkeypatch.delenv("GTRAIN_SSH_KEY")  # b without the cluster's key: refused, nothing recorded
    monkeypatch.setenv("GTRAIN_HOME", str(tmp_path / "nokey"))
    ctx = Context()
    try:
        with pytest.raises(ConfigError, match="GTRAIN_SSH_KEY") as e:
            attach(ctx, "adoptva", "vast", [], load_spec(str(spec)))
        assert e.value.field == "GTRAIN_SSH_KEY"
        assert ctx.store.node_records(cid) == [] and ctx.store.get_cluster_by_id(cid).status == "terminated"
    finally:
        ctx.store.close()
    monkeypatch.setenv("GTRAIN_HOME", str(tmp_path / "a"))
    monkeypatch.setenv("GTRAIN_SSH_KEY", str(tmp_path / "team" / "id_ed25519"))
    with pytest.raises(ConfigError, match="already known"):  # a's own record: nothing to attach there
        attach(Context(), "adoptva", "vast", [], load_spec(str(spec)))
    cid2 = up_on_a_attach_on_b(tmp_path, monkeypatch, spec, "vast", [], 1)
    assert cid2 == cid
    with fake_vast.lock:
        assert not [i for i in fake_vast.instances.values() if str(i.get("label") or "").startswith(f"gtrain-{cid}-")]


def test_attach_nebius_gpu_cluster_by_label_in_the_project(fake_nebius: FakeNebius, ssh_hosts: Any,  # type: ignore[no-untyped-def]
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = two_hosts(ssh_hosts)
    fake_nebius.use_hosts(hosts)
    before = fake_nebius.live()
    spec = machine_a(tmp_path, monkeypatch, {
        "name": "adoptnb", "provider": "nebius", "num_nodes": 2, "resources": {"accelerators": "H100:1"},
        "nebius": {"project_id": PROJECT, "subnet_id": SUBNET, "ssh_user": hosts[0].user,
                   "ssh_port": int(hosts[0].port), "ssh_timeout_s": 30, "poll_s": 0.1}})
    cid = up_on_a_attach_on_b(tmp_path, monkeypatch, spec, "nebius", [PROJECT], 2)
    assert fake_nebius.live() == before
    assert not [g for g in fake_nebius.clusters.values() if g.metadata.labels["gtrain-cluster"] == cid]


@pytest.mark.parametrize("provider", ["runpod", "vast", "nebius"])
def test_attach_a_name_nothing_is_tagged_with_is_one_line_exit_2(provider: str, fake_runpod: FakeRunPod,  # type: ignore[no-untyped-def]
                                                                 fake_vast: FakeVast, fake_nebius: FakeNebius,
                                                                 tmp_path: Path, gtrain_home: Path) -> None:
    doc = {"runpod": {"resources": {"accelerators": "RTX4090:1"}},
           "vast": {"resources": {"accelerators": "RTX4090:1"}},
           "nebius": {"resources": {"accelerators": "H100:1"},
                      "nebius": {"project_id": PROJECT, "subnet_id": SUBNET}}}[provider]
    spec = tmp_path / "ghost.yaml"
    spec.write_text(json.dumps({"name": "ghost", "provider": provider, "num_nodes": 1, **doc}))
    r = subprocess.run([sys.executable, "-m", "gtrain", "attach", "ghost", "--provider", provider, str(spec)],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "ghost" in err[0] and f"no live {provider}" in err[0] and "Traceback" not in r.stderr, r.stderr
    assert len([ln for ln in err if not ln.lstrip().lower().startswith("hint:")]) == 1, r.stderr
    store = StateStore()
    try:
        assert [c for c in store.list_clusters() if c.status != "terminated"] == []  # nothing made
    finally:
        store.close()
