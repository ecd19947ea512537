"""The state store when ``GTRAIN_STATE`` is set: the local SQLite as a cache of the shared objects.

Reads (``find_cluster``, ``list_clusters``, ``intervals``, ...) first list ``clusters/`` once (at most every
:data:`PULL_EVERY` seconds in one process) and fetch, in parallel, only the objects whose version differs from
the one the cache last saw: a ``status`` of 20 unchanged clusters is one LIST. Every change is made in SQLite
first, then the cluster's whole object is written conditionally on the version this process last saw; when
another machine wrote in between (412), the two are merged and written again on the new version:

- the lease holder (``up``, ``launch``, ``down`` of the cluster: ``gtrain.sharedstate.lease``) owns the cluster
  row, its nodes, resources and cost intervals, so its copy of those wins;
- anyone may refresh a job (``status``, ``logs -f``), so jobs are merged one by one: a final record wins over
  one that is not, else the writer's own.

A live name is claimed with a create-only write of ``names/<name>.json`` (taken over, on its version, only when
the cluster it names is terminated): two machines racing ``up`` of one name never both win. Nothing secret is
written: every row was already scrubbed by ``gtrain.state``, and the object is scrubbed once more.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gtrain import redact
from gtrain.errors import ConfigError, GtrainError, StateError
from gtrain.sharedstate import runs
from gtrain.sharedstate.hostkeys import lines_for, pin
from gtrain.state import Cluster, StateStore
from gtrain.sync.condput import CondStore, Conflict

PULL_EVERY = 1.0
FORMAT = 1
_CLUSTER_COLS = ("id", "name", "provider", "status", "num_nodes", "spec_json", "region", "instance_type", "market",
                 "price_per_hour", "created_at", "terminated_at", "extra_json")
_NODE_COLS = ("rank", "address", "instance_id", "zone", "status", "meta_json")
_JOB_COLS = ("id", "status", "created_at", "ended_at", "exit_code", "info_json")
_RES_COLS = ("kind", "ref", "region", "status", "created_at", "deleted_at", "meta_json")
_INT_COLS = ("node_rank", "instance_type", "market", "price_per_hour", "started_at", "stopped_at", "cost_usd",
             "estimate", "note")


def _wire_error(e: Exception, what: str) -> GtrainError:
    if isinstance(e, GtrainError):  # already told at the store's edge (gtrain.sharedstate.edge)
        return e
    return StateError(f"shared state: {what}: {e}",
                      hint="check GTRAIN_STATE, the credentials for it and the network; the local cache is "
                           "unchanged")


class SharedStateStore(StateStore):
    def __init__(self, remote: CondStore, home: Path | None = None) -> None:
        super().__init__(home)
        self.remote = remote
        self._pulled_at = 0.0
        self._push_lock = threading.RLock()
        self._wrote: set[str] = set()  # clusters this process changed: their run archive goes up at close
        self._runs_fetched: set[str] = set()

    # ---- the cache's bookkeeping (versions in `meta`) -------------------------------------------

    def _seen(self, cid: str) -> dict[str, str]:
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (f"shared:{cid}",)).fetchone()
        return json.loads(row[0]) if row else {}

    def _mark_seen(self, c: sqlite3.Connection, cid: str, version: str, digest: str) -> None:
        c.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                  (f"shared:{cid}", json.dumps({"version": version, "digest": digest})))

    # ---- pull ------------------------------------------------------------------------------------

    def pull(self, *, force: bool = False) -> None:
        """Bring the cache up to the shared objects (one LIST, a GET per changed cluster)."""
        if not force and time.monotonic() - self._pulled_at < PULL_EVERY:
            return
        try:
            listed = self.remote.list("clusters/")
        except Exception as e:  # noqa: BLE001 - every wire's error, told as one
            raise _wire_error(e, "cannot list clusters/") from None
        stale = []
        for key, version in listed.items():
            if key.endswith(".json"):
                cid = key[len("clusters/"):-len(".json")]
                if self._seen(cid).get("version") != version:
                    stale.append(cid)
        if stale:
            with ThreadPoolExecutor(min(16, len(stale))) as pool:
                got = list(pool.map(lambda cid: (cid, self.remote.get(f"clusters/{cid}.json")), stale))
            with self._push_lock:
                for _cid, obj in got:
                    if obj is not None:
                        self._import(json.loads(obj.data), obj.version, hashlib.sha256(obj.data).hexdigest())
        self._pulled_at = time.monotonic()

    def _import(self, doc: dict[str, Any], version: str, digest: str, *, jobs_only: bool = False) -> None:
        cl = doc["cluster"]
        cid = cl["id"]
        with self.tx() as c:
            if not jobs_only:
                if cl["status"] != "terminated":  # the shared record is the truth about who holds the name
                    c.execute("UPDATE clusters SET status='terminated', terminated_at=coalesce(terminated_at, ?)"
                              " WHERE name=? AND id!=? AND status!='terminated'", (time.time(), cl["name"], cid))
                vals = [cl.get(k) for k in _CLUSTER_COLS]
                c.execute(f"INSERT INTO clusters({', '.join(_CLUSTER_COLS)}) VALUES ({', '.join('?' * len(vals))})"
                          f" ON CONFLICT(id) DO UPDATE SET "
                          + ", ".join(f"{k}=excluded.{k}" for k in _CLUSTER_COLS[1:]), vals)
                for table in ("nodes", "resources", "cost_intervals"):
                    c.execute(f"DELETE FROM {table} WHERE cluster_id=?", (cid,))
                for n in doc.get("nodes", []):
                    c.execute(f"INSERT INTO nodes(cluster_id, {', '.join(_NODE_COLS)}) VALUES (?,?,?,?,?,?,?)",
                              (cid, *[n.get(k) for k in _NODE_COLS]))
                for r in doc.get("resources", []):
                    c.execute(f"INSERT INTO resources(cluster_id, {', '.join(_RES_COLS)}) VALUES (?,?,?,?,?,?,?,?)",
                              (cid, *[r.get(k) for k in _RES_COLS]))
                for i in doc.get("intervals", []):
                    c.execute(f"INSERT INTO cost_intervals(cluster_id, {', '.join(_INT_COLS)})"
                              f" VALUES (?,?,?,?,?,?,?,?,?,?)", (cid, *[i.get(k) for k in _INT_COLS]))
            c.execute("DELETE FROM jobs WHERE cluster_id=?", (cid,))
            for j in doc.get("jobs", []):
                c.execute(f"INSERT INTO jobs(cluster_id, {', '.join(_JOB_COLS)}) VALUES (?,?,?,?,?,?,?)",
                          (cid, *[j.get(k) for k in _JOB_COLS]))
            self._mark_seen(c, cid, version, digest)
        pin(self.home, doc.get("hostkeys"))

    # ---- push ------------------------------------------------------------------------------------

    def _export(self, cid: str) -> dict[str, Any]:
        def rows(q: str, cols: tuple[str, ...]) -> list[dict[str, Any]]:
            return [{k: r[k] for k in cols} for r in self.conn.execute(q, (cid,))]

        cl = rows("SELECT * FROM clusters WHERE id=?", _CLUSTER_COLS)
        if not cl:
            raise StateError(f"shared state: no cluster {cid!r} in the local cache")
        nodes = rows("SELECT * FROM nodes WHERE cluster_id=? ORDER BY rank", _NODE_COLS)
        return {"format": FORMAT, "cluster": cl[0], "hostkeys": lines_for(self.home, nodes),
                "nodes": nodes,
                "jobs": rows("SELECT * FROM jobs WHERE cluster_id=? ORDER BY created_at, id", _JOB_COLS),
                "resources": rows("SELECT * FROM resources WHERE cluster_id=? ORDER BY id", _RES_COLS),
                "intervals": rows("SELECT * FROM cost_intervals WHERE cluster_id=? ORDER BY id", _INT_COLS)}

    @staticmethod
    def _encode(doc: dict[str, Any]) -> bytes:
        return redact.scrub(json.dumps(redact.scrub_obj(doc), sort_keys=True, separators=(",", ":"))).encode()

    def push(self, cid: str) -> None:
        """Write the cluster's object if it changed, conditionally on the version last seen; merge on a race."""
        from gtrain.sharedstate.lease import holds

        with self._push_lock:
            doc = self._export(cid)
            data = self._encode(doc)
            digest = hashlib.sha256(data).hexdigest()
            seen = self._seen(cid)
            if seen.get("digest") == digest:
                return
            version = seen.get("version") or None
            self._wrote.add(cid)
            for _ in range(20):
                try:
                    new = self.remote.put(f"clusters/{cid}.json", data, match=version, absent=version is None)
                except Conflict:
                    theirs = self.remote.get(f"clusters/{cid}.json")
                    if theirs is None:
                        version = None
                        continue
                    name = doc["cluster"]["name"]
                    merged = merge(doc, json.loads(theirs.data), ours_win=holds(name) or not self._leased(name))
                    data, version = self._encode(merged), theirs.version
                    doc = merged
                    continue
                except Exception as e:  # noqa: BLE001 - every wire's error, told as one
                    raise _wire_error(e, f"cannot write clusters/{cid}.json") from None
                digest = hashlib.sha256(data).hexdigest()
                if doc is not None and data != self._encode(self._export(cid)):
                    self._import(doc, new, digest, jobs_only=holds(doc["cluster"]["name"]))
                else:
                    with self.tx() as c:
                        self._mark_seen(c, cid, new, digest)
                return
            raise StateError(f"shared state: clusters/{cid}.json changed under 20 writes in a row",
                             hint="run the command again")

    def _leased(self, name: str) -> bool:
        """Whether another gtrain holds the cluster's lease now (then its copy of the cluster wins)."""
        got = self.remote.get(f"leases/{name}.json")
        return got is not None and float(json.loads(got.data or b"{}").get("expires", 0)) > time.time()

    # ---- names -----------------------------------------------------------------------------------

    def _claim_name(self, name: str, cid: str) -> None:
        key = f"names/{name}.json"
        data = json.dumps({"id": cid}).encode()
        for _ in range(5):
            try:
                self.remote.put(key, data, absent=True)
                return
            except Conflict:
                pass
            got = self.remote.get(key)
            if got is None:
                continue
            other = json.loads(got.data).get("id")
            odoc = self.remote.get(f"clusters/{other}.json") if other else None
            if odoc is not None and json.loads(odoc.data)["cluster"]["status"] != "terminated" and other != cid:
                raise ConfigError(f"a cluster named {name!r} already exists (in the shared state)", field="name",
                                  hint=f"use it (`gtrain launch --cluster {name}`), pick another --name, "
                                       f"or `gtrain down {name}` first")
            try:
                self.remote.put(key, data, match=got.version)
                return
            except Conflict:
                continue
        raise ConfigError(f"another machine is creating a cluster named {name!r}", field="name",
                          hint="wait for its `gtrain up`, then `gtrain status`")

    # ---- StateStore, with the shared objects behind it ---------------------------------------------

    def create_cluster(self, *, name: str, **kw: Any) -> Cluster:  # type: ignore[override]
        self.pull(force=True)
        c = super().create_cluster(name=name, **kw)
        try:
            self._claim_name(name, c.id)
        except BaseException:
            with self.tx() as conn:
                conn.execute("DELETE FROM clusters WHERE id=?", (c.id,))
            raise
        self.push(c.id)
        return c

    def get_cluster_by_id(self, cid: str) -> Cluster:
        self.pull()
        return super().get_cluster_by_id(cid)

    def find_cluster(self, name: str) -> Cluster | None:
        self.pull()
        c = super().find_cluster(name)
        if c is not None and c.id not in self._runs_fetched:  # `logs`, `plot`, `report` read the archive
            self._runs_fetched.add(c.id)
            try:
                runs.download(self, c.id)
            except Exception as e:  # noqa: BLE001 - the archive is a convenience: say it, go on
                import sys

                sys.stderr.write(f"warning: shared state: the run archive of {c.id} was not fetched: {e}\n")
        return c

    def close(self) -> None:
        """Send up the run archive of every cluster this process changed, then close the cache."""
        wrote, self._wrote = self._wrote, set()
        for cid in sorted(wrote):
            try:
                runs.upload(self, cid)
            except Exception as e:  # noqa: BLE001 - the records are written; the archive is best effort
                import sys

                sys.stderr.write(f"warning: shared state: the run archive of {cid} was not sent: {e}\n")
        super().close()

    def list_clusters(self, *, include_terminated: bool = False) -> list[Cluster]:
        self.pull()
        return super().list_clusters(include_terminated=include_terminated)

    def intervals(self, cluster_id: str | None = None) -> list[Any]:  # type: ignore[override]
        self.pull()
        return super().intervals(cluster_id)

    def _cid_of(self, table: str, key: str, value: Any) -> str | None:
        row = self.conn.execute(f"SELECT cluster_id FROM {table} WHERE {key}=?", (value,)).fetchone()
        return row[0] if row else None

    def update_cluster(self, cid: str, **fields: Any) -> None:
        super().update_cluster(cid, **fields)
        self.push(cid)

    def upsert_node(self, cluster_id: str, rank: int, **kw: Any) -> None:  # type: ignore[override]
        super().upsert_node(cluster_id, rank, **kw)
        self.push(cluster_id)

    def set_nodes_status(self, cluster_id: str, status: str) -> None:
        super().set_nodes_status(cluster_id, status)
        self.push(cluster_id)

    def record_resource(self, cluster_id: str, kind: str, ref: str, **kw: Any) -> int:  # type: ignore[override]
        rid = super().record_resource(cluster_id, kind, ref, **kw)
        self.push(cluster_id)
        return rid

    def mark_resource(self, rid: int, status: str, **kw: Any) -> None:  # type: ignore[override]
        super().mark_resource(rid, status, **kw)
        cid = self._cid_of("resources", "id", rid)
        if cid:
            self.push(cid)

    def create_job(self, cluster_id: str, job_id: str, info: dict[str, Any]) -> Any:
        job = super().create_job(cluster_id, job_id, info)
        self.push(cluster_id)
        return job

    def update_job(self, job_id: str, **kw: Any) -> None:  # type: ignore[override]
        super().update_job(job_id, **kw)
        cid = self._cid_of("jobs", "id", job_id)
        if cid:
            self.push(cid)

    def open_interval(self, cluster_id: str, node_rank: int, **kw: Any) -> int:  # type: ignore[override]
        iid = super().open_interval(cluster_id, node_rank, **kw)
        self.push(cluster_id)
        return iid

    def close_intervals(self, cluster_id: str, **kw: Any) -> None:  # type: ignore[override]
        super().close_intervals(cluster_id, **kw)
        self.push(cluster_id)

    def close_node_interval(self, cluster_id: str, node_rank: int, **kw: Any) -> None:  # type: ignore[override]
        super().close_node_interval(cluster_id, node_rank, **kw)
        self.push(cluster_id)

    def set_interval_cost(self, iid: int, cost_usd: float, **kw: Any) -> None:  # type: ignore[override]
        super().set_interval_cost(iid, cost_usd, **kw)
        cid = self._cid_of("cost_intervals", "id", iid)
        if cid:
            self.push(cid)

    def adopt(self, doc: dict[str, Any]) -> Cluster:
        """``gtrain attach``: a cluster record rebuilt from its resources' tags, claimed and written."""
        cid, name = doc["cluster"]["id"], doc["cluster"]["name"]
        self._import(doc, "", "")
        self._claim_name(name, cid)
        self.push(cid)
        return super().get_cluster_by_id(cid)


_FINAL = ("succeeded", "failed", "cancelled", "preempted")


def merge(ours: dict[str, Any], theirs: dict[str, Any], *, ours_win: bool) -> dict[str, Any]:
    """One object of two writers' (see the module's docstring for who wins what)."""
    out = dict(ours if ours_win else theirs)
    jobs: dict[str, dict[str, Any]] = {j["id"]: j for j in theirs.get("jobs", [])}
    for j in ours.get("jobs", []):
        other = jobs.get(j["id"])
        if other is None or not (other["status"] in _FINAL and j["status"] not in _FINAL):
            jobs[j["id"]] = j
    out["jobs"] = sorted(jobs.values(), key=lambda j: (j["created_at"], j["id"]))
    return out
