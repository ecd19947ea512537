"""``job.data``: datasets every node downloads at launch, with the node's own credentials.

A node has python3 (and, for the cloud it reads from, botocore or google-auth), not gtrain. So the
few pure-Python modules of gtrain's sync engine travel to the node as a zip (``gtrain-sync.pyz``) and run
there: the same incremental, verified, resumable engine as ``gtrain sync``, never the user's keys. S3 moves
through obstore where the node's python has it (``gtrain.sync.s3fast``), Azure too (``gtrain.sync.azfast``), else
through the stdlib wire clients.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from gtrain.spec import DataEntry
from gtrain.sync.bundle import bundle

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.jobs.render import NodeContext
    from gtrain.remote.base import Runner
    from gtrain.spec import Job

# Runs on the node: python3 -c DATA_MAIN BUNDLE ENTRIES_JSON. One JSON line out; exit 3 on a gtrain error.
DATA_MAIN = """
import json, sys
sys.path.insert(0, sys.argv[1])
from gtrain.errors import GtrainError
from gtrain.sync.objstore import sync
out = []
try:
    for e in json.loads(sys.argv[2]):
        r = sync(e["src"], e["dst"], delete=e["delete"])
        out.append({"src": e["src"], "dst": e["dst"], "downloaded": r.downloaded, "skipped": r.skipped,
                    "deleted": r.deleted, "bytes": r.bytes, "seconds": round(r.seconds, 3)})
except GtrainError as e:
    print(json.dumps({"error": e.message, "hint": e.hint}))
    sys.exit(3)
print(json.dumps({"results": out}))
"""


def entries_json(entries: list[DataEntry], workdir: str) -> str:
    return json.dumps([{"src": e.src, "dst": f"{workdir}/{e.dst}", "delete": e.delete} for e in entries])


def fetch_data(job: Job, runners: list[Runner], ctxs: list[NodeContext], secret_in: bytes, report: Reporter) -> None:
    """Every node downloads job.data itself, in parallel, with its own credentials: nothing of the data passes
    through this machine (nor does the sync engine, once a node holds it)."""
    import hashlib
    import shlex

    from gtrain.errors import RemoteCommandError, SyncError
    from gtrain.jobs.render import render
    from gtrain.remote.fanout import parallel

    report.info(f"downloading {len(job.data)} dataset(s) on every node")

    engine_sha = hashlib.sha256(bundle()).hexdigest()

    def one(i: int) -> None:
        r, c = runners[i], ctxs[i]
        bundle_path = f"{r.root}/gtrain-sync.pyz"
        script = render("data.sh", c, bundle=bundle_path, data_main=DATA_MAIN,
                        data_json=entries_json(job.data, c.workdir))
        r.write_file(f"{c.job_dir}/data.sh", script.encode(), 0o700)
        # the engine (~200 kB) is sent only to a node that lacks these bytes, asked in the same command
        run = f"bash {shlex.quote(c.job_dir)}/data.sh"
        cmd = f'[ "$(sha256sum {shlex.quote(bundle_path)} 2>/dev/null | cut -c1-64)" = {engine_sha} ] || exit 75; {run}'
        res = r.run(cmd, stdin=secret_in, check=False, timeout=6 * 3600)
        if res.rc == 75:
            r.write_file(bundle_path, bundle(), 0o600)
            res = r.run(run, stdin=secret_in, check=False, timeout=6 * 3600)
        last = (res.stdout.strip().splitlines() or [""])[-1]
        try:
            doc = json.loads(last)
        except ValueError:
            raise RemoteCommandError(r.label, "job.data download", res.rc, res.stderr[-2000:]) from None
        if "error" in doc:
            raise SyncError(f"node {i}: job.data: {doc['error']}", hint=doc.get("hint"))
        for d in doc["results"]:
            report.node(i, f"{d['src']} -> {d['dst']}: {d['downloaded']} downloaded, {d['skipped']} unchanged")

    parallel(one, list(range(len(runners))))
