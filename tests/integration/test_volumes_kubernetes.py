"""The spec's ``volumes:`` on kubernetes (``type: pvc``) against tests/fixtures/fake_kube.py: a claim made once by
``up`` (labelled, RWO for one pod, RWX / ROX for pods on several nodes), held by one live cluster (a second is
refused read-write), left by ``down`` with its standing charge, mounted into the next cluster's pods (the file
written before is read there, the pod's file stays), deleted only by ``gtrain volume delete``; a smaller size,
modes the pods cannot share and a missing size refused with exit 2 before anything is made; the fake refuses
what the API server refuses (a shrink, an access mode outside the enum)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gtrain.context import Context
from gtrain.errors import ConfigError
from gtrain.providers.kubernetes.volumes import ANN_HELD_BY, LABEL_VOLUME
from gtrain.runs import cluster as core
from gtrain.runs import volumes as vol_ops
from gtrain.spec import ClusterSpec, parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_kube import FakeKube, FakeNode

NS = "default"


@pytest.fixture(scope="module")
def kube() -> Iterator[FakeKube]:
    root = Path(tempfile.mkdtemp(prefix="gtrain-kvol-"))
    k = FakeKube(root, nodes=[FakeNode(f"n-{i}", {}, {"nvidia.com/gpu": "8"}) for i in range(2)]).start()
    try:
        yield k
    finally:
        k.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def kcfg(kube: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cfg = kube.kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    return cfg


def doc(name: str, vols: list[dict[str, Any]], *, nodes: int = 1, work: Path | None = None,
        run: str = "vol_job.py", **kube: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "provider": "kubernetes", "num_nodes": nodes,
                         "resources": {"accelerators": "H100:1"}, "volumes": vols,
                         "kubernetes": {"shm_gb": 0, "storage_price_per_gb_month": 0.1, **kube},
                         "job": {"image": "python:3.12", "run": run, "launcher": "python",
                                 "python": sys.executable}}
    if work is not None:
        d["job"]["workdir"] = str(work)
    return d


def spec(*a: Any, **kw: Any) -> ClusterSpec:
    return parse_spec(doc(*a, **kw))


def context() -> Context:
    return Context(store=StateStore())


def claim(kube: FakeKube, name: str) -> dict[str, Any] | None:
    with kube.lock:
        return kube.objects.get(("persistentvolumeclaims", NS, name))


def cli(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL, env={**os.environ, "KUBECONFIG": str(cfg),
                                                         "PYTHONPATH": str(Path(__file__).parents[2])})


JOB = """import pathlib
d = pathlib.Path("/kvdata")
print("seen:", (d / "seed.txt").read_text().strip(), flush=True)
(d / "from-pod.txt").write_text("written in the pod\\n")
"""


def test_made_once_held_kept_by_down_mounted_by_the_next_cluster(kube: FakeKube, kcfg: Path,
                                                                   tmp_path: Path) -> None:
    ctx = context()
    vols = [{"name": "kv-data", "size_gb": 5, "mount": "/kvdata"}]
    plan = ctx.provider("kubernetes").plan(spec("kv-a", vols))
    assert any("PersistentVolumeClaims kv-data (5Gi ReadWriteOnce at /kvdata)" in n for n in plan.notes)
    c1 = core.up(spec("kv-a", vols), ctx).cluster
    assert c1 is not None
    made = claim(kube, "kv-data")
    assert made is not None and made["metadata"]["labels"][LABEL_VOLUME] == "kv-data"
    assert "gtrain.dev/cluster" not in made["metadata"]["labels"]  # so neither down nor gc's sweep takes it
    assert made["spec"]["accessModes"] == ["ReadWriteOnce"] and made["status"]["capacity"]["storage"] == "5Gi"
    assert made["metadata"]["annotations"][ANN_HELD_BY] == c1.id
    # a second live cluster may not have it read-write: refused before anything is made (no anchor of its own)
    with pytest.raises(ConfigError, match="held by cluster kv-a") as e:
        core.up(spec("kv-b", vols), ctx)
    assert e.value.field == "volumes[0].name" and e.value.exit_code == 2
    assert not [o for (p, _, n), o in kube.objects.items() if p == "configmaps" and "kv-b" in n]
    with pytest.raises(ConfigError, match="held by cluster kv-a"):
        vol_ops.delete(ctx, "kubernetes", "kv-data", [NS])
    [listed] = [i for i in vol_ops.ls(ctx, "kubernetes", [NS]) if i.name == "kv-data"]
    assert (listed.type, listed.size_gb, listed.attached_to, listed.state) == ("pvc", 5, "kv-a", "Bound")
    report = core.down("kv-a", ctx).cost
    left = claim(kube, "kv-data")
    assert left is not None and left["metadata"]["uid"] == made["metadata"]["uid"]
    assert ANN_HELD_BY not in (left["metadata"].get("annotations") or {})
    assert [(v["name"], v["size_gb"], v["usd_per_month"]) for v in report.volumes] == [("kv-data", 5, 0.5)]
    assert report.to_dict()["standing_usd_per_month"] == 0.5
    # the next cluster's pod mounts the same claim: it reads what was there and its own file stays
    kube.pvc_dir(NS, "kv-data").mkdir(parents=True, exist_ok=True)
    (kube.pvc_dir(NS, "kv-data") / "seed.txt").write_text("kept across clusters\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "vol_job.py").write_text(JOB)
    p = tmp_path / "kv-b.yaml"
    p.write_text(yaml.safe_dump(doc("kv-b", vols, work=work)))
    res = cli(kcfg, "run", str(p), "--no-report")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "seen: kept across clusters" in out and "is kept: 5Gi" in out, out[-3000:]
    assert (kube.pvc_dir(NS, "kv-data") / "from-pod.txt").read_text() == "written in the pod\n"
    again = claim(kube, "kv-data")
    assert again is not None and again["metadata"]["uid"] == made["metadata"]["uid"]  # not made twice
    assert not [m for m, path in kube.requests if m == "DELETE" and "persistentvolumeclaims" in path]
    gone = vol_ops.delete(ctx, "kubernetes", "kv-data", [NS])
    assert gone is not None and gone.id == made["metadata"]["uid"] and claim(kube, "kv-data") is None
    assert not kube.pvc_dir(NS, "kv-data").exists() and vol_ops.delete(ctx, "kubernetes", "kv-data", [NS]) is None


def test_refusals_exit_2_nothing_made_and_modes(kube: FakeKube, kcfg: Path, tmp_path: Path) -> None:
    ctx = context()
    info = vol_ops.create(ctx, spec("kv-c", [{"name": "kv-small", "size_gb": 3, "mount": "/d"}]), "kv-small")
    assert (info.size_gb, info.state, info.usd_per_month) == (3, "Bound", 0.3)
    assert claim(kube, "kv-small")["spec"]["accessModes"] == ["ReadWriteOnce"]  # type: ignore[index]
    cases = [
        (spec("kv-s", [{"name": "kv-small", "size_gb": 2, "mount": "/d"}]), "2 is below claim kv-small's 3Gi",
         "volumes[0].size_gb"),
        (spec("kv-m", [{"name": "kv-small", "size_gb": 3, "mount": "/d"}], nodes=2),
         "need ReadWriteMany", "volumes[0].name"),
        (spec("kv-n", [{"name": "kv-nosize", "mount": "/d"}]), "required for a PersistentVolumeClaim",
         "volumes[0].size_gb"),
        (spec("kv-o", [{"name": "kv-x", "size_gb": 1, "mount": "/d"}], volumes=[{"claim": "old", "mount": "/d/x"}]),
         "overlaps kubernetes.volumes", "volumes[0].mount"),
    ]
    for s, msg, fld in cases:
        with pytest.raises(ConfigError, match=msg) as e:
            core.up(s, ctx)
        assert e.value.field == fld and e.value.exit_code == 2
    assert claim(kube, "kv-nosize") is None and claim(kube, "kv-x") is None
    assert not [n for (p, _, n) in kube.objects if p == "configmaps" and any(x in n for x in ("kv-s", "kv-m"))]
    # a larger size expands the claim (the StorageClass's business); pods on two nodes get ReadWriteMany,
    # read-only ones ReadOnlyMany
    c = core.up(spec("kv-g", [{"name": "kv-small", "size_gb": 4, "mount": "/d"},
                              {"name": "kv-rwx", "size_gb": 1, "mount": "/e"}]), ctx).cluster
    assert c is not None and claim(kube, "kv-small")["status"]["capacity"]["storage"] == "4Gi"  # type: ignore[index]
    core.down("kv-g", ctx)
    core.up(spec("kv-2", [{"name": "kv-rwx2", "size_gb": 1, "mount": "/e"},
                          {"name": "kv-ro", "size_gb": 1, "mount": "/f", "read_only": True}], nodes=2), ctx)
    assert claim(kube, "kv-rwx2")["spec"]["accessModes"] == ["ReadWriteMany"]  # type: ignore[index]
    assert claim(kube, "kv-ro")["spec"]["accessModes"] == ["ReadOnlyMany"]  # type: ignore[index]
    # read-only on a ReadOnlyMany claim: a second live cluster may share it
    c3 = core.up(spec("kv-3", [{"name": "kv-ro", "size_gb": 1, "mount": "/f", "read_only": True}], nodes=2), ctx)
    assert c3.cluster is not None
    core.down("kv-3", ctx)
    core.down("kv-2", ctx)
    for n in ("kv-small", "kv-rwx", "kv-rwx2", "kv-ro"):
        assert vol_ops.delete(ctx, "kubernetes", n, [NS]) is not None
    # the CLI: one line, exit 2, no traceback
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(doc("kv-bad", [{"name": "kv-bad", "mount": "/d"}])))
    r = cli(kcfg, "up", str(p))
    assert r.returncode == 2 and "volumes[0].size_gb" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert claim(kube, "kv-bad") is None


def test_fake_refuses_what_the_api_server_refuses(kube: FakeKube, kcfg: Path) -> None:
    """The fake's PVC rules, through lightkube and gtrain's translation of the API's errors."""
    from lightkube import ApiError, codecs
    from lightkube.resources.core_v1 import PersistentVolumeClaim

    from gtrain.providers.kubernetes.api import client, edge

    c = client(None, NS)

    def body(name: str, size: str, modes: list[str]) -> Any:
        return codecs.from_dict({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
                                 "spec": {"accessModes": modes, "resources": {"requests": {"storage": size}}}})

    for name, size, modes, said in [("kv-bad-mode", "1Gi", ["ReadWriteSometimes"], 'Unsupported value: '
                                     '"ReadWriteSometimes"'), ("kv-bad-qty", "lots", ["ReadWriteOnce"],
                                                               "quantities must match"),
                                    ("kv-no-mode", "1Gi", [], "at least 1 access mode is required"),
                                    ("KV_Upper", "1Gi", ["ReadWriteOnce"], "RFC 1123 subdomain")]:
        with pytest.raises(ApiError) as e:
            c.create(body(name, size, modes))
        assert e.value.status.code == 422 and said in (e.value.status.message or ""), e.value.status.message
    c.create(body("kv-shrink", "2Gi", ["ReadWriteOnce"]))
    got = c.get(PersistentVolumeClaim, "kv-shrink", namespace=NS)
    got.spec.resources.requests["storage"] = "1Gi"
    with pytest.raises(ConfigError, match="spec.resources.requests.storage: Forbidden: field can not be less than "
                                          "previous value") as ce, edge("update PersistentVolumeClaim kv-shrink", NS):
        c.replace(got)
    assert ce.value.exit_code == 2
    got.spec.resources.requests["storage"] = "2Gi"
    got.spec.accessModes = ["ReadWriteMany"]
    with pytest.raises(ApiError, match="spec is immutable"):
        c.replace(got)
    c.delete(PersistentVolumeClaim, "kv-shrink", namespace=NS)
    assert json.loads(json.dumps(claim(kube, "kv-shrink"))) is None


def test_kubernetes_volumes_is_a_deprecated_alias_still_mounted(kube: FakeKube, kcfg: Path) -> None:
    """The old kubernetes.volumes still mounts its claim, with a warning naming volumes:; the pod spec carries
    both it and the spec's claim (objects() reads only spec, cluster and job_id of the request)."""
    from gtrain.events import Reporter
    from gtrain.providers.kubernetes import objects as ko
    from gtrain.providers.kubernetes.options import parse_options
    from gtrain.providers.kubernetes.provider import KubernetesProvider

    class Said(Reporter):
        def __init__(self) -> None:
            self.warnings: list[str] = []

        def warn(self, msg: str) -> None:
            self.warnings.append(msg)

    said = Said()
    s = spec("kv-old", [{"name": "kv-new", "size_gb": 1, "mount": "/new"}],
             volumes=[{"claim": "legacy", "mount": "/old", "read_only": True}])
    plan = KubernetesProvider(StateStore(), said).plan(s)
    assert [w for w in said.warnings if "kubernetes.volumes is deprecated" in w and "volumes:" in w], said.warnings
    assert any("kubernetes.volumes is deprecated" in n for n in plan.notes)
    from types import SimpleNamespace

    request: Any = SimpleNamespace(spec=s, cluster=SimpleNamespace(id="kv-old-1", num_nodes=1, name="kv-old"),
                                   job_id="kv-old-1-j1")
    [*_, job] = ko.objects(request, parse_options(s), "kv-old-j1", 29500, 1, None, None)
    pod = job["spec"]["template"]["spec"]
    claims = {v["name"]: v["persistentVolumeClaim"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"vol0": {"claimName": "legacy", "readOnly": True}, "gv0": {"claimName": "kv-new",
                                                                                   "readOnly": False}}
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert (mounts["vol0"], mounts["gv0"]) == ("/old", "/new")


def test_rbac_without_claims_is_refused_at_up(kube: FakeKube, kcfg: Path) -> None:
    ctx = context()
    kube.denied.add(("create", "persistentvolumeclaims"))
    try:
        with pytest.raises(ConfigError, match="RBAC denies create persistentvolumeclaims") as e:
            core.up(spec("kv-rbac", [{"name": "kv-rbac", "size_gb": 1, "mount": "/d"}]), ctx)
        assert e.value.exit_code == 2 and "persistentvolumeclaims" in (e.value.hint or "")
        assert claim(kube, "kv-rbac") is None
    finally:
        kube.denied.discard(("create", "persistentvolumeclaims"))


def test_read_only_claim_is_mounted_read_only_in_the_pod(kube: FakeKube, kcfg: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "vol_job.py").write_text("import pathlib\ntry:\n    pathlib.Path('/kvro/x').write_text('x')\n"
                                     "    print('wrote', flush=True)\nexcept OSError as e:\n"
                                     "    print('refused:', e.strerror, flush=True)\n")
    p = tmp_path / "kv-ro1.yaml"
    p.write_text(yaml.safe_dump(doc("kv-ro1", [{"name": "kv-ro1", "size_gb": 1, "mount": "/kvro", "read_only": True}],
                                    work=work)))
    res = cli(kcfg, "run", str(p), "--no-report")
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "refused: Read-only file system" in out, out[-3000:]
    assert not (kube.pvc_dir(NS, "kv-ro1") / "x").exists()
    assert vol_ops.delete(context(), "kubernetes", "kv-ro1", [NS]) is not None
