"""The workdir to the nodes: pushed from this machine to each node below a few nodes, else sent once and
pulled by the nodes (docs/scale.md, "Nodes pull the workdir").

Pull: the files :func:`gtrain.sync.workdir.list_workdir` selects become one tar named by its sha256
(deterministic: sorted, mtimes and modes kept, owner 0), built in ``$GTRAIN_HOME/bundles/``. It goes once

- to the run's store when the job has ``job.checkpoint_store`` (``<store>/gtrain-workdir/<sha256>.tar``; not
  sent again when the store already holds that object), the nodes downloading it with their own credentials
  (the job's env and secrets, through the sync engine, as ``job.data``), or
- to node 0 (over the runner, as before; not sent when node 0 holds it already), which serves it on its
  cluster address from a short-lived HTTP server (a random token in the path, ended when the fetches are done
  or after 10 minutes) to the other nodes.

Each node fetches in parallel, checks the sha256 before unpacking (a mismatch is refused and fetched again),
and unpacks as ``put_files`` copies (files whose size and mtime match stay, nothing deleted). A node that
could not get the bundle is pushed the files from this machine, with one warning line saying why. When some
node found the store's (or node 0's) copy corrupt, this machine sends it there once more first.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shlex
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain.remote.nodebundle import UPLOAD

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.jobs.render import NodeContext
    from gtrain.remote.base import Runner
    from gtrain.spec import Job

#: below this many nodes the workdir is pushed to each node (rsync's incremental copy is faster there:
#: docs/scale.md); ``GTRAIN_WORKDIR_PULL_MIN_NODES`` changes it (a huge value: always push)
PULL_MIN_NODES = 4
STORE_PREFIX = "gtrain-workdir"
SERVE_TTL_S = 600
_CHUNK = 1 << 20

# Appended to gtrain.remote.nodebundle's source and run by data.sh as python3 -c SCRIPT PYZ JSON: the store is
# read through the sync engine in the pyz, with the node's own credentials. One JSON line out.
STORE_MAIN = """
def _store_download(url, key, part):
    sys.path.insert(0, sys.argv[1])
    from pathlib import Path
    from gtrain.sync.objstore import make_backend, parse_location
    base = parse_location(url, "job.checkpoint_store")
    backend = make_backend(base, fld="job.checkpoint_store", workers=4)
    try:
        obj = backend.head(base, key)
        if obj is None:
            raise FileNotFoundError(f"{url}: no object {key}")
        backend.download(base, obj, Path(part), progress=lambda _n: None)
        return os.path.getsize(part)
    finally:
        backend.close()

if __name__ == "__main__" and sys.argv[1].endswith(".pyz"):
    print(json.dumps(fetch(sys.argv[2], store_download=_store_download)))
"""


@dataclass
class Bundle:
    path: Path
    sha256: str
    size: int
    files: int


@dataclass
class ShipResult:
    """What moving the workdir did: ``mode`` push | store | node0; ``uploads``/``uploaded_bytes``: the bundle
    sent by this machine (to the store or node 0); ``fetched``: nodes that pulled it; ``cached``: nodes that held
    it already; ``pushed``: nodes given the files by this machine."""

    mode: str
    sha256: str = ""
    bundle_bytes: int = 0
    uploads: int = 0
    uploaded_bytes: int = 0
    fetched: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    pushed: list[int] = field(default_factory=list)
    seed: int | None = None  # node0 mode: the node this machine sent the bundle to, which served the others
    seconds: float = 0.0


def pull_min_nodes() -> int:
    from gtrain.errors import ConfigError

    raw = os.environ.get("GTRAIN_WORKDIR_PULL_MIN_NODES", str(PULL_MIN_NODES))
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"GTRAIN_WORKDIR_PULL_MIN_NODES={raw!r} is not a whole number of nodes >= 1",
                          hint="unset it (default 4) or give e.g. GTRAIN_WORKDIR_PULL_MIN_NODES=8",
                          field="GTRAIN_WORKDIR_PULL_MIN_NODES")
    return n


def build_bundle(local: Path, files: list[str], into: Path | None = None) -> Bundle:
    """The tar of ``files`` (relative to ``local``), deterministic, in ``into`` (default
    ``$GTRAIN_HOME/bundles``) as ``<sha256>.tar``; older bundles there are removed after a day."""
    from gtrain.state import gtrain_home

    out = into or gtrain_home() / "bundles"
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = out / f".build-{os.getpid()}-{secrets.token_hex(4)}.tar"
    h = hashlib.sha256()

    class _Hashing:
        def __init__(self, f: Any) -> None:
            self.f = f

        def write(self, b: bytes) -> int:
            h.update(b)
            return int(self.f.write(b))

    try:
        with open(tmp, "wb") as raw, tarfile.open(fileobj=_Hashing(raw), mode="w|",  # type: ignore[call-overload]
                                                  format=tarfile.GNU_FORMAT) as tf:
            for rel in files:
                p = local / rel
                st = p.stat()
                info = tarfile.TarInfo(rel)
                info.size, info.mtime, info.mode = st.st_size, int(st.st_mtime), st.st_mode & 0o777
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(p, "rb") as f:
                    tf.addfile(info, f)
        sha = h.hexdigest()
        final = out / f"{sha}.tar"
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    now = time.time()
    for old in out.glob("*.tar"):
        if old != final and now - old.stat().st_mtime > 86400:
            old.unlink(missing_ok=True)
    return Bundle(final, sha, final.stat().st_size, len(files))


def _source() -> str:
    from gtrain.remote import nodebundle

    return Path(nodebundle.__file__).read_text(encoding="utf-8")


def _node_call(r: Runner, func: str, *args: str, timeout: float = 120) -> dict[str, Any]:
    res = r.run_python(_source(), [func, *args], timeout=timeout)
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def _store_put(store_url: str, b: Bundle, force: bool) -> tuple[str, bool]:
    """The bundle in the store (once: an object of that name and size, and of that sha256 where the store keeps
    gtrain's metadata, is not sent again, unless ``force``).
    Returns the object's key and whether this machine uploaded it."""
    from gtrain.sync.local import hash_file
    from gtrain.sync.model import RemoteURL
    from gtrain.sync.objstore import make_backend, parse_location

    base = parse_location(store_url, "job.checkpoint_store")
    assert isinstance(base, RemoteURL)
    key = base.key(f"{STORE_PREFIX}/{b.sha256}.tar")
    backend = make_backend(base, fld="job.checkpoint_store")
    try:
        there = backend.head(base, key)
        if there is not None and there.size == b.size and there.sha256 in (None, b.sha256) and not force:
            return key, False
        backend.upload(b.path, base, key, size=b.size, digests=hash_file(b.path), expect=there,
                       progress=lambda _n: None)
        return key, True
    finally:
        backend.close()


def ship_workdir(job: Job, runners: list[Runner], ctxs: list[NodeContext], picked: list[int], local: Path,
                 files: list[str], secret_in: bytes, report: Reporter) -> ShipResult:
    """The workdir onto the ``picked`` nodes (their workdir folders exist): pushed to each below
    :func:`pull_min_nodes` nodes or on nodes that share this machine's disk, else one bundle pulled by all."""
    from gtrain.errors import GtrainError
    from gtrain.remote.local import LocalRunner

    t0 = time.monotonic()
    if len(picked) < pull_min_nodes() or any(isinstance(runners[i], LocalRunner) for i in picked):
        res = ShipResult("push")
        _push(runners, ctxs, picked, local, files, report, res, quiet=False)
        res.seconds = round(time.monotonic() - t0, 3)
        return res
    b = build_bundle(local, files)
    res = ShipResult("node0", b.sha256, b.size)
    store = job.checkpoint_store or ""
    if store and "://" in store:
        try:
            key, sent = _store_put(store, b, force=False)
        except GtrainError as e:  # this machine cannot write the bundle there: node 0 serves it instead
            report.warn(f"workdir: could not put the bundle in {store}: {e.message}; node {picked[0]} serves it "
                        "instead")
        else:
            res.mode = "store"
            if sent:
                res.uploads, res.uploaded_bytes = 1, b.size
            _via_store(runners, ctxs, picked, local, files, secret_in, report, b, store, key, sent, res)
            res.seconds = round(time.monotonic() - t0, 3)
            return res
    _via_node0(runners, ctxs, picked, local, files, report, b, res)
    res.seconds = round(time.monotonic() - t0, 3)
    return res


def _fetch_all(nodes: list[int], one: Any) -> dict[int, dict[str, Any]]:
    from gtrain.errors import GtrainError
    from gtrain.remote.fanout import parallel

    def safe(i: int) -> dict[str, Any]:
        try:
            return dict(one(i))
        except GtrainError as e:
            return {"ok": False, "error": e.message, "corrupt": False}
        except ValueError as e:  # not one JSON line back
            return {"ok": False, "error": f"no answer: {e}", "corrupt": False}

    return dict(zip(nodes, parallel(safe, nodes), strict=True))


def _settle(results: dict[int, dict[str, Any]], res: ShipResult) -> list[int]:
    """Record the nodes that have it; return those that failed."""
    failed = []
    for i, doc in results.items():
        if doc.get("ok"):
            (res.cached if doc.get("cached") else res.fetched).append(i)
        else:
            failed.append(i)
    return failed


def _via_store(runners: list[Runner], ctxs: list[NodeContext], picked: list[int], local: Path, files: list[str],
               secret_in: bytes, report: Reporter, b: Bundle, store: str, key: str, sent: bool,
               res: ShipResult) -> None:
    from gtrain.checkpoints.bundle import BUNDLE
    from gtrain.checkpoints.bundle import bundle as tool_bundle
    from gtrain.errors import GtrainError
    from gtrain.jobs.render import render
    from gtrain.sync.model import RemoteURL
    from gtrain.sync.objstore import parse_location

    base = store.rstrip("/")
    loc = parse_location(store, "job.checkpoint_store")
    assert isinstance(loc, RemoteURL)
    src = [{"kind": "store", "url": f"{loc.scheme}://{loc.bucket}", "key": key}]
    source = _source() + STORE_MAIN

    def one(i: int) -> dict[str, Any]:
        r, c = runners[i], ctxs[i]
        pyz = f"{r.root}/{BUNDLE}"  # the checkpoint tool (the sync engine in it), there since the store's probe
        doc = json.dumps({"root": r.root, "workdir": c.workdir, "sha": b.sha256, "sources": src, "tries": 2})
        script = render("data.sh", c, bundle=pyz, data_main=source, data_json=doc)
        r.write_file(f"{c.job_dir}/workdir.sh", script.encode(), 0o700)
        cmd = f"[ -f {shlex.quote(pyz)} ] || exit 75; bash {shlex.quote(c.job_dir)}/workdir.sh"
        out = r.run(cmd, stdin=secret_in, check=False, timeout=3600)
        if out.rc == 75:  # not shipped by the probe (a caller that skipped it): sent, once
            r.write_file(pyz, tool_bundle(), 0o600)
            out = r.run(cmd, stdin=secret_in, check=False, timeout=3600)
        lines = out.stdout.strip().splitlines()
        if out.rc != 0 or not lines:
            return {"ok": False, "error": f"exit {out.rc}: {out.stderr.strip()[-300:]}", "corrupt": False}
        return dict(json.loads(lines[-1]))

    results = _fetch_all(picked, one)
    failed = _settle(results, res)
    if failed and any(results[i].get("corrupt") for i in failed):
        report.warn(f"workdir: node(s) {failed} found the bundle in {store} corrupt (sha256 mismatch); "
                    "sending it there again")
        try:
            _store_put(store, b, force=True)
        except GtrainError as e:
            report.warn(f"workdir: could not send the bundle to {store} again: {e.message}")
        else:
            res.uploads += 1
            res.uploaded_bytes += b.size
            again = _fetch_all(failed, one)
            results.update(again)
            failed = _settle(again, res)
    where = f"{base}/{STORE_PREFIX}/{b.sha256}.tar"
    _fallback(runners, ctxs, failed, results, where, local, files, report, res)
    report.info(f"workdir: bundle {b.sha256[:12]} ({b.size / 1e6:.1f} MB, {b.files} files) "
                + ("uploaded once to" if sent else "already in") + f" {base}/{STORE_PREFIX}/; "
                + _summary(res))


def _via_node0(runners: list[Runner], ctxs: list[NodeContext], picked: list[int], local: Path, files: list[str],
               report: Reporter, b: Bundle, res: ShipResult) -> None:
    from gtrain.errors import GtrainError

    seed, others = picked[0], picked[1:]
    r0 = runners[seed]
    bdir = f"{r0.root}/.gtrain-bundles"

    def seed_fetch(force: bool) -> dict[str, Any]:
        adopt = force or not _node_call(r0, "have", r0.root, b.sha256)["have"]
        if adopt:  # under a fixed name: rsync sends the delta against node 0's last upload, not the whole tar
            stage = b.path.parent / "stage"
            stage.mkdir(exist_ok=True, mode=0o700)
            (stage / UPLOAD).unlink(missing_ok=True)
            try:
                os.link(b.path, stage / UPLOAD)
            except OSError:  # no hard links here
                import shutil

                shutil.copy2(b.path, stage / UPLOAD)
            r0.put_files(stage, [UPLOAD], bdir)
            res.uploads += 1
            res.uploaded_bytes += b.size
        doc = json.dumps({"root": r0.root, "workdir": ctxs[seed].workdir, "sha": b.sha256, "sources": [],
                          "adopt": adopt})
        return _node_call(r0, "fetch", doc, timeout=3600)

    try:
        first = seed_fetch(False)
        if not first.get("ok"):  # what arrived is not the bundle (the check removed it): once more
            first = seed_fetch(True)
    except GtrainError as e:
        first = {"ok": False, "error": e.message}
    if not first.get("ok"):
        report.warn(f"workdir: node {seed} could not take the bundle ({first.get('error')}); pushing the files "
                    "to every node from this machine")
        _push(runners, ctxs, picked, local, files, report, res, quiet=False)
        return
    res.seed = seed
    if res.uploads == 0:
        res.cached.append(seed)
    token = secrets.token_urlsafe(18)
    try:
        srv = _node_call(r0, "serve", bdir, r0.address, token, str(SERVE_TTL_S))
    except (GtrainError, ValueError) as e:
        why = e.message if isinstance(e, GtrainError) else str(e)
        report.warn(f"workdir: node {seed} could not serve the bundle ({why[:300]}); pushing the files to the "
                    "other nodes from this machine")
        _push(runners, ctxs, others, local, files, report, res, quiet=False)
        return
    host = f"[{r0.address}]" if ":" in r0.address else r0.address
    url = f"http://{host}:{srv['port']}/{token}/{b.sha256}.tar"
    src = [{"kind": "http", "url": url}]
    try:
        def one(i: int) -> dict[str, Any]:
            doc = json.dumps({"root": runners[i].root, "workdir": ctxs[i].workdir, "sha": b.sha256,
                              "sources": src, "tries": 2, "timeout": 60})
            return _node_call(runners[i], "fetch", doc, timeout=3600)

        results = _fetch_all(others, one)
    finally:
        try:
            _node_call(r0, "stop", bdir, token)
        except GtrainError as e:  # it ends by itself after SERVE_TTL_S
            report.warn(f"workdir: node {seed}'s bundle server (pid {srv['pid']}) not stopped: {e.message}")
    failed = _settle(results, res)
    _fallback(runners, ctxs, failed, results, f"node {seed} ({r0.address}:{srv['port']})", local, files, report,
              res)
    report.info(f"workdir: bundle {b.sha256[:12]} ({b.size / 1e6:.1f} MB, {b.files} files) "
                + ("sent once to" if res.uploads else "already on") + f" node {seed}; " + _summary(res))


def _summary(res: ShipResult) -> str:
    return (f"{len(res.fetched)} node(s) fetched it, {len(res.cached)} had it, {len(res.pushed)} pushed "
            f"from this machine")


def _fallback(runners: list[Runner], ctxs: list[NodeContext], failed: list[int], results: dict[int, dict[str, Any]],
              where: str, local: Path, files: list[str], report: Reporter, res: ShipResult) -> None:
    for i in failed:
        report.warn(f"node {i}: could not fetch the workdir bundle from {where}: "
                    f"{str(results[i].get('error'))[:300]}; pushing the workdir from this machine instead")
    if failed:
        _push(runners, ctxs, failed, local, files, report, res, quiet=True)


def _push(runners: list[Runner], ctxs: list[NodeContext], nodes: list[int], local: Path, files: list[str],
          report: Reporter, res: ShipResult, *, quiet: bool) -> None:
    from gtrain.remote.fanout import parallel

    def one(i: int) -> None:
        moved = runners[i].put_files(local, files, ctxs[i].workdir)
        if not quiet:
            report.node(i, f"workdir synced ({moved} of {len(files)} files changed)")

    parallel(one, nodes)
    res.pushed.extend(nodes)
