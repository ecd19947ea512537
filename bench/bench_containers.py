"""Benchmark of job.image (not a test): what running a node's launcher inside a container adds to a launch.

    .venv/bin/python bench/bench_containers.py [--runs 5]

From ``gtrain.launch`` to the first rank's first line, for the same 1-node x 1-process job with a cached image
and without an image, on the ``local`` provider (a real dockerd, tests/fixtures/docker.py) and on the ``ssh``
provider (an sshd test host with its own dockerd; the image pulled once from the test registry with basic auth,
then cached). Interleaved runs, medians; overhead = median(image) - median(no image); target <= 2 s per launch.
Prints a table and writes bench/results/containers.json; exit 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import gtrain  # noqa: E402
from gtrain.jobs.backend import LogLine  # noqa: E402
from tests.fixtures.docker import start_dockerd, start_registry, start_ssh_docker_hosts  # noqa: E402

TARGET_S = 2.0
PYROOT = Path(os.path.realpath(sys.executable)).parents[1]
MOUNTS = [{"host": p, "path": p, "read_only": True} for p in sorted({"/usr", str(PYROOT), sys.prefix})]
JOB = ("import os, time\n"
       "m = open('/gtrain-image-marker').read().strip() if os.path.exists('/gtrain-image-marker') else 'host'\n"
       "print(f'first line rank {os.environ.get(\"RANK\")} in {m}', flush=True)\n")


def write_spec(work: Path, name: str, provider: str, section: dict[str, Any] | None, image: str | None,
               creds: dict[str, str] | None = None) -> Path:
    job: dict[str, Any] = {"workdir": str(work), "run": "first.py", "nproc_per_node": 1, "python": sys.executable,
                           "env": {"OMP_NUM_THREADS": "1"}}
    if image:
        job.update(image=image, container={"mounts": MOUNTS}, **({"image_credentials": creds} if creds else {}))
    spec: dict[str, Any] = {"name": name, "provider": provider, "num_nodes": 1, "job": job}
    if section:
        spec[provider] = section
    p = work / f"{name}.yaml"
    p.write_text(json.dumps(spec))
    return p


def first_line_s(spec: Path, name: str) -> float:
    """Seconds from gtrain.launch to the first rank's first line (the job then runs to its end)."""
    seen: list[float] = []

    def on_line(ln: LogLine) -> None:
        if not seen and ln.text.startswith("first line"):
            seen.append(time.perf_counter())

    t0 = time.perf_counter()
    job = gtrain.launch(spec)
    final = gtrain.wait(name, job_id=job.job_id, on_line=on_line)
    if final.exit_code != 0 or not seen:
        raise RuntimeError(f"{name}: job {job.job_id} ended {final.status} {final.exit_code} (line seen: {bool(seen)})")
    return seen[0] - t0


def measure(pairs: list[tuple[str, Path, Path]], runs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, plain, image in pairs:
        for spec in (plain, image):  # up, and one unmeasured launch each (the image pulled/cached, caches warm)
            gtrain.up(spec)
            first_line_s(spec, spec.stem)
        a: list[float] = []
        b: list[float] = []
        for _ in range(runs):  # interleaved: a shared machine's load hits both alike
            a.append(first_line_s(plain, plain.stem))
            b.append(first_line_s(image, image.stem))
        over = statistics.median(b) - statistics.median(a)
        out[label] = {"no_image_s": a, "image_s": b, "median_no_image_s": statistics.median(a),
                      "median_image_s": statistics.median(b), "overhead_s": over, "ok": over <= TARGET_S}
    return out


def container_start(image: str, runs: int) -> dict[str, Any]:
    """The container alone: ``docker run`` (gtrain's namespace flags) of /usr/bin/true vs /usr/bin/true."""
    import subprocess

    argv = ["docker", "run", "--rm", "-i", "--init", "--network", "host", "--ipc", "host", "--pid", "host",
            "-v", "/usr:/usr:ro", image, "/usr/bin/true"]
    a: list[float] = []
    b: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(["/usr/bin/true"], check=True)
        a.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, capture_output=True)
        b.append(time.perf_counter() - t0)
    return {"true_s": a, "docker_run_true_s": b, "median_added_s": statistics.median(b) - statistics.median(a)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="gtrain-bench-ctr-")
    os.environ["GTRAIN_HOME"] = home
    os.environ["NO_COLOR"] = "1"
    work = Path(home) / "work"
    work.mkdir()
    (work / "first.py").write_text(JOB)
    made: list[str] = []
    try:
        with start_dockerd() as d, start_registry(d) as reg, start_ssh_docker_hosts(reg, n=1) as sh:
            os.environ["DOCKER_HOST"] = d.host
            os.environ["BENCH_REG_PASSWORD"] = reg.password
            host = sh.hosts[0].ssh
            section = {"user": host.user, "identity_file": host.identity_file, "python": sys.executable,
                       "hosts": [f"{host.address}:{host.port}"]}
            creds = {"username": reg.user, "password_secret": "BENCH_REG_PASSWORD"}
            pairs = [("local", write_spec(work, "bcl", "local", None, None),
                      write_spec(work, "bcli", "local", None, d.image)),
                     ("ssh", write_spec(work, "bcs", "ssh", section, None),
                      write_spec(work, "bcsi", "ssh", section, sh.image, creds))]
            made = [p.stem for _label, a, b in pairs for p in (a, b)]
            start = container_start(d.image, max(10, args.runs))
            results = measure(pairs, args.runs)
            for name in made:
                gtrain.down(name, yes=True)
            made = []
    finally:
        for name in made:
            try:
                gtrain.down(name, yes=True)
            except Exception as e:  # noqa: BLE001 - report, keep cleaning
                print(f"clean-up: down {name}: {e}", file=sys.stderr)
    print(f"{'provider':<8} {'no image (s)':>13} {'cached image (s)':>17} {'overhead (s)':>13}  target <= {TARGET_S} s")
    for label, r in results.items():
        print(f"{label:<8} {r['median_no_image_s']:>13.2f} {r['median_image_s']:>17.2f} {r['overhead_s']:>13.2f}"
              f"  {'ok' if r['ok'] else 'MISSED'}")
    print(f"docker run of /usr/bin/true with gtrain's flags adds {start['median_added_s']:.2f} s (median)")
    out = HERE / "results" / "containers.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"runs": args.runs, "target_s": TARGET_S, "machine": platform.node(),
                               "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
                               "container_start": start, "results": results}, indent=2))
    print(f"results: {out}")
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
