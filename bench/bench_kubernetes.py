"""`gtrain launch` on provider kubernetes, to the first line a rank prints, against creating the very same
objects (the ConfigMap, headless Service and Indexed Job gtrain renders for that launch) with the lightkube
client directly, to the same line -- both on tests/fixtures/fake_kube.py (an API server at the wire whose kubelet
runs each pod as real processes; a 2-pod x 2-process torchrun job, gloo). Target: gtrain <= 1.3x the client.
Medians of --runs; writes bench/results/kubernetes.json. Run as root (the fake kubelet uses mount namespaces)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRAIN = ('import torch.distributed as d\nd.init_process_group("gloo")\n'
         'print("first line rank", d.get_rank(), flush=True)\n')
NEEDLE = "first line rank"


def first_line(kube: Any, job: str, t0: float, timeout: float = 300) -> float:
    """Seconds from t0 until a pod of Job ``job`` logged a rank's first line (the pod log, as the API serves it)."""
    while time.monotonic() - t0 < timeout:
        for p in kube.select("pods", "default", {"job-name": job}):
            run = kube.runs.get(p["metadata"]["name"])
            if run is not None and run.log.exists() and NEEDLE in run.log.read_text(errors="replace"):
                return time.monotonic() - t0
        time.sleep(0.02)
    raise RuntimeError(f"no {NEEDLE!r} in the pods of {job} within {timeout}s")


def delete_job_objects(client: Any, kube: Any, job: str, label: dict[str, str]) -> None:
    from lightkube.resources.batch_v1 import Job
    from lightkube.resources.core_v1 import ConfigMap, Service
    from lightkube.types import CascadeType

    client.delete(Job, job, namespace="default", cascade=CascadeType.FOREGROUND, grace_period=0)
    for kind in (Service, ConfigMap):
        for o in client.list(kind, namespace="default", labels=label):
            client.delete(kind, o.metadata.name, namespace="default")
    while kube.select("pods", "default", {"job-name": job}):
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_kubernetes: run as root (the fake kubelet unshares mount namespaces)")
        return 1
    import gtrain
    from gtrain.jobs.backend import JobRequest
    from gtrain.providers import get_provider
    from gtrain.providers.kubernetes import objects as ko
    from gtrain.providers.kubernetes.api import client as kube_client
    from gtrain.runs.launch import new_job_id
    from gtrain.spec import parse_spec
    from gtrain.state import StateStore
    from tests.fixtures.fake_kube import FakeKube, FakeNode

    tmp = Path(tempfile.mkdtemp(prefix="gtrain-bench-kube-"))
    os.environ["GTRAIN_HOME"] = str(tmp / "home")
    work = tmp / "work"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    kube = FakeKube(tmp / "kube", nodes=[FakeNode(f"gpu-{i}", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                                                  {"nvidia.com/gpu": "8"}) for i in range(2)]).start()
    os.environ["KUBECONFIG"] = str(kube.kubeconfig(tmp / "kubeconfig"))
    hand: list[float] = []
    ours: list[float] = []
    try:
        spec = parse_spec({"name": "bench-kube", "provider": "kubernetes", "num_nodes": 2,
                           "resources": {"accelerators": "H100:8"}, "kubernetes": {"shm_gb": 0},
                           "job": {"image": "nvcr.io/nvidia/pytorch:25.01-py3", "workdir": str(work),
                                   "run": "train.py", "nproc_per_node": 2, "python": sys.executable,
                                   "env": {"OMP_NUM_THREADS": "1"}}})
        cluster = gtrain.up(spec).cluster
        assert cluster is not None
        c = kube_client(None, "default")
        store = StateStore()
        backend = get_provider("kubernetes", store).job_backend(store.get_cluster_by_id(cluster.id))
        from lightkube import codecs

        for i in range(args.runs):
            # by hand: the objects gtrain renders for a launch, created with the client, nothing else
            req = backend.reserve(JobRequest(store.get_cluster_by_id(cluster.id), spec, new_job_id("bench-kube"),
                                             str(work)))
            objs = backend.dryrun(req).private["objects"]
            name = objs[-1]["metadata"]["name"]
            t0 = time.monotonic()
            for o in objs:
                c.create(codecs.from_dict(o))
            hand.append(first_line(kube, name, t0))
            delete_job_objects(c, kube, name, {ko.LABEL_JOB: objs[0]["metadata"]["labels"][ko.LABEL_JOB]})
            # gtrain launch (the Python API: spec check, state, render, the same three creates)
            t0 = time.monotonic()
            job = gtrain.launch(spec).job_id
            kname = store.get_job(job).info["k8s_name"]
            ours.append(first_line(kube, kname, t0))
            gtrain.wait("bench-kube", job_id=job)
            print(f"run {i + 1}: client by hand {hand[-1]:.2f}s, gtrain launch {ours[-1]:.2f}s", flush=True)
        store.close()
        gtrain.down("bench-kube")
    finally:
        kube.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    h, o = statistics.median(hand), statistics.median(ours)
    res = {"hand_s": hand, "gtrain_s": ours, "hand_median_s": round(h, 3), "gtrain_median_s": round(o, 3),
           "ratio": round(o / h, 3), "target": 1.3, "ok": o / h <= 1.3}
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "kubernetes.json").write_text(json.dumps(res, indent=2))
    print(f"client by hand: {h:.2f}s  gtrain launch: {o:.2f}s  ratio {o / h:.2f}x (target <= 1.3x)")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
