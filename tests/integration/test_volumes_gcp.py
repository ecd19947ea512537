"""The spec's ``volumes:`` on gcp (persistent disks), against the session's fake Compute Engine
(tests/fixtures/fake_gce.py): made once in the nodes' zone, attached to node 0 (a read-only one to every node,
READ_ONLY), left by ``down`` (a standing charge in the cost report), reused by the next cluster, refused to a second
live cluster, in another region or zone, or smaller than it is; grown when the spec asks for more; deleted only by
``gtrain volume delete``. The fake mounts nothing: the mount script runs here against stand-ins for the tools."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gtrain.context import Context
from gtrain.costs.report import cluster_cost
from gtrain.errors import ConfigError, ProviderError
from gtrain.providers.cloud.volumes import mount_script
from gtrain.providers.gcp.provider import GCPProvider
from gtrain.runs import cluster as core
from gtrain.runs import volumes as vol_ops
from gtrain.spec import ClusterSpec, parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_gce import PROJECT, FakeGCE

pytestmark = pytest.mark.usefixtures("fake_gce")

REGION = "us-central1"


def spec(name: str, volumes: list[dict[str, Any]], *, nodes: int = 1, region: str = REGION,
         zones: list[str] | None = None) -> ClusterSpec:
    res: dict[str, Any] = {"accelerators": "T4:1", "region": region, "disk_gb": 100}
    if zones:
        res["zones"] = zones
    return parse_spec({"name": name, "provider": "gcp", "num_nodes": nodes, "resources": res, "volumes": volumes,
                       "gcp": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.05}})


def context() -> Context:
    ctx = Context(store=StateStore())
    ctx._providers["gcp"] = GCPProvider(ctx.store, ctx.report)
    return ctx


def disks(fake: FakeGCE, name: str) -> list[dict[str, Any]]:
    with fake.lock:
        return [dict(d) for d in fake.disks.values() if d.get("labels", {}).get("gtrain-volume") == name]


def instances(fake: FakeGCE) -> set[str]:
    with fake.lock:
        return {n for _, n in fake.instances}


def link(zone: str, name: str) -> str:
    return f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{zone}/instances/{name}"


def test_made_once_kept_by_down_reused_and_deleted_only_by_volume_delete(fake_gce: FakeGCE) -> None:
    ctx = context()
    vols = [{"name": "gv-data", "size_gb": 20, "mount": "/data"}]
    s1 = spec("gvol-a", vols, nodes=2)
    assert any("pin the cluster to us-central1" in n for n in ctx.provider("gcp").plan(s1).notes)
    c1 = core.up(s1, ctx).cluster
    assert c1 is not None
    [d] = disks(fake_gce, "gv-data")
    node0 = next(n for n in ctx.store.nodes(c1.id) if n.rank == 0)
    assert d["zone"].endswith(f"/{node0.zone}") and d["sizeGb"] == "20" and d["type"].endswith("/pd-balanced")
    assert d["users"] == [link(node0.zone or "", node0.instance_id or "")]  # node 0 only, read-write
    assert "gtrain-cluster" not in d["labels"] and d["name"] == "gtrain-gv-data"  # so teardown and gc never take it
    with fake_gce.lock:
        att = [a for a in fake_gce.instances[(node0.zone, node0.instance_id)]["disks"] if not a.get("boot")]
    assert [(a["deviceName"], a["mode"], a["autoDelete"]) for a in att] == [("gtrain-gv-data", "READ_WRITE", False)]
    # a second live cluster may not have it (read-write, one node's disk): refused before anything is made
    before = instances(fake_gce)
    with pytest.raises(ConfigError, match="attached read-write to cluster gvol-a") as e:
        core.up(spec("gvol-b", vols), ctx)
    assert e.value.field == "volumes[0].name" and e.value.exit_code == 2 and instances(fake_gce) == before
    report = core.down("gvol-a", ctx).cost
    [left] = disks(fake_gce, "gv-data")
    assert left["id"] == d["id"] and left["users"] == []  # deleting the instance detached it, and kept it
    assert report.volumes == [{"name": "gv-data", "id": "gtrain-gv-data", "type": "pd-balanced", "region": REGION,
                               "size_gb": 20, "usd_per_gb_month": 0.1, "usd_per_month": 2.0}]
    assert report.to_dict()["standing_usd_per_month"] == 2.0
    # the next cluster finds it by label, in its zone, and attaches the same disk
    c2 = core.up(spec("gvol-b", vols), ctx).cluster
    assert c2 is not None
    [again] = disks(fake_gce, "gv-data")
    n0 = next(n for n in ctx.store.nodes(c2.id) if n.rank == 0)
    assert again["id"] == d["id"] and again["users"] == [link(n0.zone or "", n0.instance_id or "")]
    listed = vol_ops.ls(ctx, "gcp", [REGION])
    assert [(i.name, i.id, i.attached_to, i.state) for i in listed if i.name == "gv-data"] == [
        ("gv-data", "gtrain-gv-data", "gvol-b", "in-use")]
    with pytest.raises(ConfigError, match="attached to cluster gvol-b"):
        vol_ops.delete(ctx, "gcp", "gv-data", [REGION])
    core.down("gvol-b", ctx)
    assert cluster_cost(ctx.store, ctx.store.get_cluster_by_id(c2.id), ctx.provider("gcp")).volumes
    assert disks(fake_gce, "gv-data")  # down never deletes it
    # `gtrain gc --provider gcp` (scoped by zone) lists it as held by no live cluster, and leaves it
    swept = vol_ops.sweep(ctx.provider("gcp"), [], [d["zone"].rsplit("/", 1)[1]], False)  # type: ignore[arg-type]
    assert [(v.name, v.usd_per_month) for v in swept.orphans if v.name == "gv-data"] == [("gv-data", 2.0)]
    gone = vol_ops.delete(ctx, "gcp", "gv-data", [REGION])
    assert gone is not None and gone.id == "gtrain-gv-data" and not disks(fake_gce, "gv-data")
    assert vol_ops.delete(ctx, "gcp", "gv-data", [REGION]) is None


def test_refused_in_another_region_zone_or_smaller_nothing_made_and_a_disk_pins_the_zone(fake_gce: FakeGCE) -> None:
    ctx = context()
    east = vol_ops.create(ctx, spec("gvol-e", [{"name": "gv-east", "size_gb": 30, "mount": "/d"}],
                                    region="us-east1"), "gv-east")
    assert (east.zone, east.size_gb, east.state) == ("us-east1-b", 30, "available")
    zoned = vol_ops.create(ctx, spec("gvol-z", [{"name": "gv-zone", "size_gb": 30, "mount": "/d", "type": "pd-ssd"}],
                                     zones=["us-central1-b"]), "gv-zone")
    assert (zoned.zone, zoned.type, zoned.usd_per_gb_month) == ("us-central1-b", "pd-ssd", 0.17)
    try:
        before = instances(fake_gce)
        cases = [
            (spec("gvol-w", [{"name": "gv-east", "size_gb": 30, "mount": "/d"}]),
             "is in us-east1-b, the cluster goes to us-central1", "volumes[0].name"),
            (spec("gvol-x", [{"name": "gv-zone", "size_gb": 30, "mount": "/d"}], zones=["us-central1-a"]),
             "is in us-central1-b, not in resources.zones", "volumes[0].name"),
            (spec("gvol-s", [{"name": "gv-zone", "size_gb": 10, "mount": "/d"}]),
             "10 is below volume gv-zone's 30 GB", "volumes[0].size_gb"),
            (spec("gvol-t", [{"name": "gv-tiny", "size_gb": 5, "mount": "/d"}]),
             "a persistent disk is 10..65536 GB", "volumes[0].size_gb"),
            (spec("gvol-n", [{"name": "gv-nosize", "mount": "/d"}]), "required for a persistent disk",
             "volumes[0].size_gb"),
        ]
        for s, msg, fld in cases:
            with pytest.raises(ConfigError, match=msg) as e:
                core.up(s, ctx)
            assert e.value.field == fld and e.value.exit_code == 2
            assert ctx.store.find_cluster(s.name) is None or ctx.store.find_cluster(s.name).status == "terminated"
        assert instances(fake_gce) == before and not disks(fake_gce, "gv-tiny")
        # an existing disk pins the zone, and a larger size_gb grows it (disks.resize; the mount grows the fs)
        c = core.up(spec("gvol-p", [{"name": "gv-zone", "size_gb": 40, "mount": "/d"}]), ctx).cluster
        assert c is not None and {n.zone for n in ctx.store.nodes(c.id)} == {"us-central1-b"}
        [d] = disks(fake_gce, "gv-zone")
        assert d["sizeGb"] == "40" and len(d["users"]) == 1
        [rec] = ctx.store.get_cluster_by_id(c.id).extra["volumes"]
        assert (rec["size_gb"], rec["grow"], rec["usd_per_gb_month"]) == (40, True, 0.17)
        core.down("gvol-p", ctx)
        assert disks(fake_gce, "gv-zone")[0]["users"] == []
    finally:
        for name in ("gv-east", "gv-zone"):
            vol_ops.delete(ctx, "gcp", name)


def test_read_only_attaches_to_every_node_and_is_shared_read_only(fake_gce: FakeGCE) -> None:
    ctx = context()
    made = vol_ops.create(ctx, spec("gvol-r", [{"name": "gv-ref", "size_gb": 10, "mount": "/ref"}]), "gv-ref")
    ro = [{"name": "gv-ref", "size_gb": 10, "mount": "/ref", "read_only": True}]
    try:
        c1 = core.up(spec("gvol-r1", ro, nodes=2, zones=[made.zone or ""]), ctx).cluster
        c2 = core.up(spec("gvol-r2", ro, zones=[made.zone or ""]), ctx).cluster  # shared: read-only on both
        assert c1 is not None and c2 is not None
        [d] = disks(fake_gce, "gv-ref")
        assert sorted(u.rsplit("/", 1)[1] for u in d["users"]) == sorted([f"{c1.id}-0", f"{c1.id}-1", f"{c2.id}-0"])
        with fake_gce.lock:
            modes = {a["mode"] for i in fake_gce.instances.values() for a in i["disks"] if not a.get("boot")}
        assert modes == {"READ_ONLY"}
        with pytest.raises(ConfigError, match="attached read-only to cluster gvol-r1") as e:
            core.up(spec("gvol-rw", [{"name": "gv-ref", "size_gb": 10, "mount": "/ref"}]), ctx)
        assert e.value.field == "volumes[0].name"
        core.down("gvol-r1", ctx)
        core.down("gvol-r2", ctx)
        assert disks(fake_gce, "gv-ref")[0]["users"] == []
    finally:
        vol_ops.delete(ctx, "gcp", "gv-ref")


def test_the_fake_refuses_what_gce_refuses(fake_gce: FakeGCE) -> None:
    """Shrinking, a second read-write attach (the operation's RESOURCE_IN_USE_BY_ANOTHER_RESOURCE), deleting a
    disk in use, a disk type GCE has not, a bad name: each refused as GCE answers, translated at the edge."""
    from google.cloud import compute_v1

    from gtrain.providers.gcp import api

    ctx = context()
    p: GCPProvider = ctx.provider("gcp")  # type: ignore[assignment]
    s = spec("gvol-f", [{"name": "gv-fake", "size_gb": 12, "mount": "/f"}], nodes=2)
    c = core.up(s, ctx).cluster
    assert c is not None
    zone = next(n.zone for n in ctx.store.nodes(c.id))
    assert zone is not None
    disk = p.volumes.get(PROJECT, zone, "gtrain-gv-fake")
    try:
        with pytest.raises(ProviderError, match="must be larger than existing size '12'"):
            with api.gce("resize"):
                p.compute.disks.resize(project=PROJECT, zone=zone, disk="gtrain-gv-fake",
                                       disks_resize_request_resource=compute_v1.DisksResizeRequest(size_gb=11))
        with pytest.raises(ProviderError) as e:  # node 1 asks for it read-write while node 0 holds it
            with api.gce("attach"):
                op = p.compute.clients.instances.attach_disk(
                    project=PROJECT, zone=zone, instance=f"{c.id}-1", attached_disk_resource=compute_v1.AttachedDisk(
                        source=disk.self_link, device_name="x", mode="READ_WRITE"))
            api.wait_zone_op(p.compute.clients, PROJECT, zone, op.name, "attach")
        assert api.code(e.value) == "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE" and "already being used by" in str(e.value)
        with pytest.raises(ProviderError, match="already being used by"):
            with api.gce("delete"):
                p.compute.disks.delete(project=PROJECT, zone=zone, disk="gtrain-gv-fake")
        for body, msg in [({"name": "gtrain-x", "size_gb": 10, "type_": f"zones/{zone}/diskTypes/pd-fast"},
                           "diskTypes/pd-fast' was not found"),
                          ({"name": "Bad_Name", "size_gb": 10, "type_": f"zones/{zone}/diskTypes/pd-ssd"},
                           "resource.name"),
                          ({"name": "gtrain-y", "size_gb": 70000, "type_": f"zones/{zone}/diskTypes/pd-ssd"},
                           "resource.sizeGb")]:
            with pytest.raises(ProviderError, match=msg):
                with api.gce("insert"):
                    p.compute.disks.insert(project=PROJECT, zone=zone, disk_resource=compute_v1.Disk(**body))
    finally:
        core.down("gvol-f", ctx)
        vol_ops.delete(ctx, "gcp", "gv-fake")


def test_cli_ls_create_delete(tmp_path: Path, gtrain_home: Path) -> None:
    def gtrain(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gtrain", "volume", *args], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL, env={**os.environ})

    p = tmp_path / "s.yaml"
    p.write_text(json.dumps({"name": "gvol-cli", "provider": "gcp", "resources": {"accelerators": "T4:1",
                                                                                 "region": REGION},
                             "volumes": [{"name": "gv-cli", "size_gb": 15, "mount": "/data", "type": "pd-standard"}]}))
    r = gtrain("create", "-f", str(p), "gv-cli", "--json")
    assert r.returncode == 0, r.stderr
    made = json.loads(r.stdout)["volume"]
    assert (made["name"], made["size_gb"], made["zone"], made["usd_per_month"]) == ("gv-cli", 15, "us-central1-a", 0.6)
    r = gtrain("ls", "--provider", "gcp", "--json")
    assert r.returncode == 0 and "gtrain-gv-cli" in [v["id"] for v in json.loads(r.stdout)["volumes"]], r.stderr
    r = gtrain("ls", "--provider", "gcp", "--region", REGION)
    assert r.returncode == 0 and "gv-cli" in r.stdout and "standing charge" in r.stdout
    r = gtrain("delete", "gv-cli", "--provider", "gcp", "--yes")
    assert r.returncode == 0 and "deleted volume gv-cli (gtrain-gv-cli, us-central1-a)" in r.stdout, r.stderr
    r = gtrain("delete", "gv-cli", "--provider", "gcp", "--yes")
    assert r.returncode == 2 and "no volume gv-cli" in r.stderr and "Traceback" not in r.stderr


STUBS = {
    "sudo": 'echo "sudo $*" >> "$LOG"; exec "$@"',
    "blkid": 'echo "blkid $*" >> "$LOG"; [ -f "$STATE/fs" ] && exit 0; exit 2',  # 2: blank
    "mkfs.ext4": 'echo "mkfs $*" >> "$LOG"; touch "$STATE/fs"',
    "mount": 'echo "mount $*" >> "$LOG"; touch "$STATE/mounted"',
    "mountpoint": '[ -f "$STATE/mounted" ]',
    "chown": 'echo "chown $*" >> "$LOG"',
    "resize2fs": 'echo "resize2fs $*" >> "$LOG"',
}


def test_mount_finds_the_disk_by_its_google_device_name_and_grows_it(tmp_path: Path) -> None:
    bin_, state, by_id = tmp_path / "bin", tmp_path / "state", tmp_path / "by-id"
    for d in (bin_, state, by_id):
        d.mkdir()
    for name, body in STUBS.items():
        (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    disk = tmp_path / "sdb"
    disk.write_text("")
    (by_id / "google-gtrain-data").symlink_to(disk)
    log, mnt = tmp_path / "log", tmp_path / "data"
    rec = {"name": "data", "id": "gtrain-data", "mount": str(mnt), "read_only": False, "grow": True,
           "candidates": ["/dev/disk/by-id/google-gtrain-data", "/dev/disk/by-id/scsi-0Google_PersistentDisk_x"]}
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "LOG": str(log), "STATE": str(state)}

    def run(r: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        log.write_text("")
        script = mount_script([r], wait_s=1).replace("/dev/disk/by-id/", f"{by_id}/")
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)

    r = run(rec)
    assert r.returncode == 0, r.stderr
    steps = [ln.split()[0] for ln in log.read_text().splitlines() if not ln.startswith("sudo")]
    assert steps == ["blkid", "mkfs", "mount", "chown", "resize2fs"] and f"mount {disk} {mnt}" in log.read_text()
    r = run(rec)  # mounted already: only the (idempotent) grow
    assert r.returncode == 0 and "already mounted" in r.stdout
    assert [ln.split()[0] for ln in log.read_text().splitlines() if not ln.startswith("sudo")] == ["resize2fs"]
    r = run({**rec, "name": "gone", "candidates": ["/dev/disk/by-id/google-gtrain-gone"]})
    assert r.returncode == 1 and "volume gone (gtrain-data) did not appear" in r.stderr


class _Runner:
    def __init__(self) -> None:
        self.scripts: list[str] = []

    def run(self, script: str, timeout: float = 0) -> None:
        self.scripts.append(script)


def test_mount_runs_on_the_nodes_that_hold_each_disk() -> None:
    """node 0 mounts the read-write disk and the read-only one; node 1 only the read-only one; nothing is run when
    the nodes are not waited for (wait_ssh: false), which is said."""
    from gtrain.events import Reporter

    class Said(Reporter):
        def __init__(self) -> None:
            self.warnings: list[str] = []

        def warn(self, msg: str) -> None:
            self.warnings.append(msg)

    store = StateStore()
    try:
        said = Said()
        vols = GCPProvider(store, said).volumes
        runners = [_Runner(), _Runner()]
        recs = [{"name": "rw", "id": "gtrain-rw", "mount": "/rw", "read_only": False, "nodes": [0],
                 "device": "/dev/disk/by-id/google-gtrain-rw"},
                {"name": "ro", "id": "gtrain-ro", "mount": "/ro", "read_only": True, "nodes": [0, 1],
                 "device": "/dev/disk/by-id/google-gtrain-ro"}]
        vols.mount(lambda: runners, recs, reachable=False)  # type: ignore[arg-type, return-value]
        assert runners[0].scripts == [] and "not mounted" in said.warnings[0]
        vols.mount(lambda: runners, recs, reachable=True)  # type: ignore[arg-type, return-value]
        [s0], [s1] = runners[0].scripts, runners[1].scripts
        assert "google-gtrain-rw" in s0 and "scsi-0Google_PersistentDisk_gtrain-ro" in s0 and "mount -o ro" in s0
        assert "gtrain-rw" not in s1 and "google-gtrain-ro" in s1
    finally:
        store.close()


def test_a_replaced_node_0_gets_the_disk_back_and_start_mounts_it_again(fake_gce: FakeGCE,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Recovery replaces node 0: the disk follows it to the new instance; a stop/start keeps the disk attached and
    runs node 0's mount again (the boot took the mount)."""
    from gtrain.runs import stopstart

    ctx = context()
    p = ctx.provider("gcp")
    mounted: list[list[str]] = []
    monkeypatch.setattr(p.volumes, "mount", lambda runners, vols, reachable: mounted.append([v["name"] for v in vols]))
    c = core.up(spec("gvol-r", [{"name": "gv-moves", "size_gb": 10, "mount": "/data"}], nodes=2), ctx).cluster
    assert c is not None

    def users() -> tuple[list[str], str]:
        [d] = disks(fake_gce, "gv-moves")
        n0 = next(n for n in ctx.store.nodes(c.id) if n.rank == 0 and n.status != "terminated")
        return list(d.get("users") or []), link(n0.zone or "", n0.instance_id or "")

    try:
        held, first = users()
        assert held == [first] and mounted == [["gv-moves"]]
        n0 = next(n for n in ctx.store.nodes(c.id) if n.rank == 0)
        with fake_gce.lock:
            old_id = fake_gce.instances[(n0.zone, n0.instance_id)]["id"]
        p.replace_nodes(ctx.store.get_cluster_by_id(c.id), [0])
        held, now = users()  # GCE names the new instance as the old one: same URL, a new machine
        assert held == [now], (held, now)
        n0 = next(n for n in ctx.store.nodes(c.id) if n.rank == 0 and n.status != "terminated")
        with fake_gce.lock:
            inst = fake_gce.instances[(n0.zone, n0.instance_id)]
            assert inst["id"] != old_id  # a new machine
            att = [a["deviceName"] for a in inst["disks"] if not a.get("boot")]
        assert att == ["gtrain-gv-moves"] and len(mounted) == 2
        stopstart.stop("gvol-r", ctx)
        stopstart.start("gvol-r", ctx)
        assert mounted == [["gv-moves"]] * 3 and users()[0] == [users()[1]]
    finally:
        core.down("gvol-r", ctx)
        vol_ops.delete(ctx, "gcp", "gv-moves", [REGION])
