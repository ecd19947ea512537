"""The state store: SQLite at ``$GTRAIN_HOME/state.db``.

WAL mode, a schema version in ``meta``, every write in an ``IMMEDIATE`` transaction with a generous busy
timeout, so two gtrain commands at once serialise instead of corrupting anything. Rows hold JSON text,
never pickles. The database is opened on first use, never at import.

A cluster's ``id`` is unique for all time; its ``name`` is unique among clusters that are not terminated,
so ``gtrain cost`` keeps the history of every cluster ever run under a name.

Nothing secret is stored: every JSON and text value written goes through :func:`gtrain.redact.scrub`, and
``GTRAIN_HOME`` is kept 0700 (an existing one with looser permissions is tightened when the store opens it,
unless it is not ours, is sticky like ``/tmp`` or is the home directory itself) with ``state.db`` and its
``-wal``/``-shm`` files 0600.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gtrain import redact
from gtrain.errors import ClusterNotFound, ConfigError, StateError
from gtrain.state.identity import identity

if TYPE_CHECKING:
    from gtrain.state.nodes import NodeRecord

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clusters (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    provider TEXT NOT NULL,
    status TEXT NOT NULL,
    num_nodes INTEGER NOT NULL,
    spec_json TEXT NOT NULL,
    region TEXT,
    instance_type TEXT,
    market TEXT,
    price_per_hour REAL NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    terminated_at REAL,
    extra_json TEXT NOT NULL DEFAULT '{}'
);
CREATE UNIQUE INDEX IF NOT EXISTS clusters_live_name ON clusters(name) WHERE status != 'terminated';
CREATE TABLE IF NOT EXISTS nodes (
    cluster_id TEXT NOT NULL REFERENCES clusters(id),
    rank INTEGER NOT NULL,
    address TEXT,
    instance_id TEXT,
    zone TEXT,
    status TEXT NOT NULL,
    meta_json TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (cluster_id, rank)
);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    cluster_id TEXT NOT NULL REFERENCES clusters(id),
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    ended_at REAL,
    exit_code INTEGER,
    info_json TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS jobs_cluster ON jobs(cluster_id, created_at);
CREATE TABLE IF NOT EXISTS resources (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id TEXT NOT NULL REFERENCES clusters(id),
    kind TEXT NOT NULL,
    ref TEXT NOT NULL,
    region TEXT,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    deleted_at REAL,
    meta_json TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS resources_cluster ON resources(cluster_id);
CREATE TABLE IF NOT EXISTS cost_intervals (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    cluster_id TEXT NOT NULL REFERENCES clusters(id),
    node_rank INTEGER NOT NULL,
    instance_type TEXT,
    market TEXT,
    price_per_hour REAL NOT NULL DEFAULT 0,
    started_at REAL NOT NULL,
    stopped_at REAL,
    cost_usd REAL,
    estimate INTEGER NOT NULL DEFAULT 0,
    note TEXT
);
CREATE INDEX IF NOT EXISTS cost_cluster ON cost_intervals(cluster_id);
"""

LIVE = ("provisioning", "up", "terminating", "failed")
TERMINAL_JOB = ("succeeded", "failed", "cancelled", "preempted")


def gtrain_home() -> Path:
    return Path(os.environ.get("GTRAIN_HOME") or Path.home() / ".gtrain").expanduser()


@dataclass
class Cluster:
    id: str
    name: str
    provider: str
    status: str
    num_nodes: int
    spec: dict[str, Any]
    region: str | None
    instance_type: str | None
    market: str | None
    price_per_hour: float
    created_at: float
    terminated_at: float | None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Node:
    cluster_id: str
    rank: int
    address: str | None
    instance_id: str | None
    zone: str | None
    status: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Job:
    id: str
    cluster_id: str
    status: str
    created_at: float
    ended_at: float | None
    exit_code: int | None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Resource:
    id: int
    cluster_id: str
    kind: str
    ref: str
    region: str | None
    status: str
    created_at: float
    deleted_at: float | None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class CostInterval:
    id: int
    cluster_id: str
    node_rank: int
    instance_type: str | None
    market: str | None
    price_per_hour: float
    started_at: float
    stopped_at: float | None
    cost_usd: float | None
    estimate: bool
    note: str | None


def _j(v: Any) -> str:
    """JSON text for a row, with every registered secret value scrubbed (before and after encoding)."""
    return redact.scrub(json.dumps(redact.scrub_obj(v), sort_keys=True, separators=(",", ":")))


def _t(v: Any) -> Any:
    """A text column, scrubbed."""
    return redact.scrub(v) if isinstance(v, str) else v


def _register(info: dict[str, Any]) -> None:
    """A job's secrets, by the names its record keeps, if this process has them (``gtrain status`` run from
    the shell that launched it): what a node reports back is scrubbed even in a process that launched nothing."""
    names = info.get("secret_names")
    if isinstance(names, list):
        redact.register_secrets(str(n) for n in names)



class StateStore:
    def __init__(self, home: Path | None = None) -> None:
        self.home = Path(home) if home else gtrain_home()
        self.path = self.home / "state.db"
        self._conn: sqlite3.Connection | None = None
        # One connection, shared by the threads of a fan-out: writes take turns (a second BEGIN on the same
        # connection would fail). Other processes are serialised by SQLite's own locking (busy_timeout).
        self._lock = threading.RLock()

    # ---- connection ----------------------------------------------------------------------------

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
            except (FileExistsError, NotADirectoryError):  # the home, or a folder above it, is a file
                why = "it is a file" if self.home.exists() else "a path above it is a file"
                raise ConfigError(f"GTRAIN_HOME {str(self.home)!r} is not a directory: {why}",
                                  hint="point GTRAIN_HOME at a folder (gtrain creates it)",
                                  field="GTRAIN_HOME") from None
            try:
                redact.secure_home(self.home, self.path)
                conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
                conn.row_factory = sqlite3.Row
                conn.execute("PRAGMA busy_timeout=30000")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA foreign_keys=ON")
                conn.execute("PRAGMA synchronous=NORMAL")
                self._migrate(conn)
                redact.secure_home(self.home, self.path)  # the -wal/-shm SQLite just made
            except sqlite3.DatabaseError as e:
                raise StateError(f"cannot open state database {self.path}: {e}",
                                 hint="move it aside and run again; `gtrain gc` finds cloud resources by tag") from None
            self._conn = conn
        return self._conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise StateError(
                    f"state database {self.path} has schema {row[0]}, newer than this gtrain ({SCHEMA_VERSION})",
                    hint="upgrade gtrain",
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def schema_version(self) -> int:
        row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0])

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        conn = self.conn
        with self._lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ---- clusters ------------------------------------------------------------------------------

    def create_cluster(self, *, name: str, provider: str, num_nodes: int, spec: dict[str, Any],
                       region: str | None = None, instance_type: str | None = None, market: str | None = None,
                       price_per_hour: float = 0.0, extra: dict[str, Any] | None = None,
                       cluster_id: str | None = None) -> Cluster:
        """A new cluster record (``cluster_id``: the id its resources' tags carry, for `gtrain attach`)."""
        cid = cluster_id or f"{name}-{uuid.uuid4().hex[:8]}"
        now = time.time()
        extra = {"by": identity(), **(extra or {})}
        try:
            with self.tx() as c:
                c.execute(
                    "INSERT INTO clusters(id, name, provider, status, num_nodes, spec_json, region, instance_type,"
                    " market, price_per_hour, created_at, extra_json) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (cid, name, provider, "provisioning", num_nodes, _j(spec), region, instance_type, market,
                     price_per_hour, now, _j(extra or {})),
                )
        except sqlite3.IntegrityError:
            raise ConfigError(f"a cluster named {name!r} already exists", field="name",
                              hint=f"use it (`gtrain launch --cluster {name}`), pick another --name, "
                                   f"or `gtrain down {name}` first") from None
        return self.get_cluster_by_id(cid)

    def _cluster(self, row: sqlite3.Row) -> Cluster:
        return Cluster(
            id=row["id"], name=row["name"], provider=row["provider"], status=row["status"],
            num_nodes=row["num_nodes"], spec=json.loads(row["spec_json"]), region=row["region"],
            instance_type=row["instance_type"], market=row["market"], price_per_hour=row["price_per_hour"],
            created_at=row["created_at"], terminated_at=row["terminated_at"], extra=json.loads(row["extra_json"]),
        )

    def get_cluster_by_id(self, cid: str) -> Cluster:
        row = self.conn.execute("SELECT * FROM clusters WHERE id=?", (cid,)).fetchone()
        if row is None:
            raise ClusterNotFound(cid)
        return self._cluster(row)

    def find_cluster(self, name: str) -> Cluster | None:
        """The live cluster with this name, else the most recent terminated one, else None."""
        row = self.conn.execute(
            "SELECT * FROM clusters WHERE name=? ORDER BY (status='terminated'), created_at DESC LIMIT 1", (name,)
        ).fetchone()
        if row:  # `logs`, `exec`, `pull`, `plot`: mask what the cluster's jobs print, their secrets by name
            for (info,) in self.conn.execute("SELECT info_json FROM jobs WHERE cluster_id=?", (row["id"],)):
                _register(json.loads(info))
        return self._cluster(row) if row else None

    def get_cluster(self, name: str) -> Cluster:
        c = self.find_cluster(name)
        if c is None:
            raise ClusterNotFound(name)
        return c

    def list_clusters(self, *, include_terminated: bool = False) -> list[Cluster]:
        q = "SELECT * FROM clusters"
        if not include_terminated:
            q += " WHERE status != 'terminated'"
        return [self._cluster(r) for r in self.conn.execute(q + " ORDER BY created_at")]

    def update_cluster(self, cid: str, **fields: Any) -> None:
        cols = []
        vals: list[Any] = []
        for k, v in fields.items():
            if k in ("spec", "extra"):
                k, v = f"{k}_json", _j(v)
            cols.append(f"{k}=?")
            vals.append(_t(v))
        with self.tx() as c:
            c.execute(f"UPDATE clusters SET {', '.join(cols)} WHERE id=?", (*vals, cid))

    # ---- nodes ---------------------------------------------------------------------------------

    def upsert_node(self, cluster_id: str, rank: int, *, status: str, address: str | None = None,
                    instance_id: str | None = None, zone: str | None = None,
                    meta: dict[str, Any] | None = None) -> None:
        with self.tx() as c:
            c.execute(
                "INSERT INTO nodes(cluster_id, rank, address, instance_id, zone, status, meta_json)"
                " VALUES (?,?,?,?,?,?,?) ON CONFLICT(cluster_id, rank) DO UPDATE SET"
                " address=coalesce(excluded.address, address), instance_id=coalesce(excluded.instance_id, instance_id),"
                " zone=coalesce(excluded.zone, zone), status=excluded.status, meta_json=excluded.meta_json",
                (cluster_id, rank, address, instance_id, zone, status, _j(meta or {})),
            )

    def nodes(self, cluster_id: str) -> list[Node]:
        rows = self.conn.execute("SELECT * FROM nodes WHERE cluster_id=? ORDER BY rank", (cluster_id,))
        return [Node(r["cluster_id"], r["rank"], r["address"], r["instance_id"], r["zone"], r["status"],
                     json.loads(r["meta_json"])) for r in rows]

    def put_node(self, cluster_id: str, node: NodeRecord) -> None:
        """Record (or update) one node from its typed record."""
        self.upsert_node(cluster_id, node.rank, status=node.status, address=node.address,
                         instance_id=node.instance_id, zone=node.zone, meta=node.to_meta())

    def node_records(self, cluster_id: str) -> list[NodeRecord]:
        """The cluster's nodes as typed records, in rank order."""
        from gtrain.state.nodes import NodeRecord

        return [NodeRecord.from_stored(n.rank, n.status, n.address, n.instance_id, n.zone, n.meta)
                for n in self.nodes(cluster_id)]

    def set_nodes_status(self, cluster_id: str, status: str) -> None:
        with self.tx() as c:
            c.execute("UPDATE nodes SET status=? WHERE cluster_id=?", (status, cluster_id))

    # ---- resources (recorded before creation, marked after deletion) ----------------------------

    def record_resource(self, cluster_id: str, kind: str, ref: str, *, region: str | None = None,
                        meta: dict[str, Any] | None = None, status: str = "creating") -> int:
        with self.tx() as c:
            cur = c.execute(
                "INSERT INTO resources(cluster_id, kind, ref, region, status, created_at, meta_json)"
                " VALUES (?,?,?,?,?,?,?)", (cluster_id, kind, _t(ref), region, status, time.time(), _j(meta or {})),
            )
            return int(cur.lastrowid or 0)

    def mark_resource(self, rid: int, status: str, *, ref: str | None = None,  # created|deleted|not-created|…
                      meta: dict[str, Any] | None = None) -> None:
        sets: list[str] = ["status=?"]
        vals: list[Any] = [status]
        if status == "deleted":
            sets.append("deleted_at=?")
            vals.append(time.time())
        if ref is not None:
            sets.append("ref=?")
            vals.append(_t(ref))
        if meta is not None:
            sets.append("meta_json=?")
            vals.append(_j(meta))
        with self.tx() as c:
            c.execute(f"UPDATE resources SET {', '.join(sets)} WHERE id=?", (*vals, rid))

    def resources(self, cluster_id: str, *, live_only: bool = False) -> list[Resource]:
        q = "SELECT * FROM resources WHERE cluster_id=?"
        if live_only:
            q += " AND status NOT IN ('deleted', 'not-created')"
        rows = self.conn.execute(q + " ORDER BY id", (cluster_id,))
        return [Resource(r["id"], r["cluster_id"], r["kind"], r["ref"], r["region"], r["status"], r["created_at"],
                         r["deleted_at"], json.loads(r["meta_json"])) for r in rows]

    # ---- jobs ----------------------------------------------------------------------------------

    def create_job(self, cluster_id: str, job_id: str, info: dict[str, Any]) -> Job:
        info = {"by": identity(), **info}
        _register(info)
        with self.tx() as c:
            c.execute("INSERT INTO jobs(id, cluster_id, status, created_at, info_json) VALUES (?,?,?,?,?)",
                      (job_id, cluster_id, "pending", time.time(), _j(info)))
        return self.get_job(job_id)

    def _job(self, r: sqlite3.Row) -> Job:
        info = json.loads(r["info_json"])
        _register(info)  # what this job prints is masked in any process that reads it
        return Job(r["id"], r["cluster_id"], r["status"], r["created_at"], r["ended_at"], r["exit_code"], info)

    def get_job(self, job_id: str) -> Job:
        r = self.conn.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        if r is None:
            raise ConfigError(f"no job {job_id!r}", field="--job", hint="`gtrain status CLUSTER` lists jobs")
        return self._job(r)

    def jobs(self, cluster_id: str) -> list[Job]:
        rows = self.conn.execute("SELECT * FROM jobs WHERE cluster_id=? ORDER BY created_at", (cluster_id,))
        return [self._job(r) for r in rows]

    def latest_job(self, cluster_id: str) -> Job | None:
        r = self.conn.execute("SELECT * FROM jobs WHERE cluster_id=? ORDER BY created_at DESC LIMIT 1",
                              (cluster_id,)).fetchone()
        return self._job(r) if r else None

    def update_job(self, job_id: str, *, status: str, exit_code: int | None = None,
                   info: dict[str, Any] | None = None) -> None:
        ended = time.time() if status in TERMINAL_JOB else None
        if info is not None:
            _register(info)
        with self.tx() as c:
            c.execute(
                "UPDATE jobs SET status=?, exit_code=coalesce(?, exit_code),"
                " ended_at=CASE WHEN ? IS NULL THEN ended_at ELSE coalesce(ended_at, ?) END,"
                " info_json=coalesce(?, info_json) WHERE id=?",
                (status, exit_code, ended, ended, _j(info) if info is not None else None, job_id),
            )

    # ---- cost intervals ------------------------------------------------------------------------

    def open_interval(self, cluster_id: str, node_rank: int, *, instance_type: str | None, market: str | None,
                      price_per_hour: float, started_at: float | None = None, note: str | None = None) -> int:
        with self.tx() as c:
            cur = c.execute(
                "INSERT INTO cost_intervals(cluster_id, node_rank, instance_type, market, price_per_hour,"
                " started_at, note) VALUES (?,?,?,?,?,?,?)",
                (cluster_id, node_rank, instance_type, market, price_per_hour, started_at or time.time(), _t(note)),
            )
            return int(cur.lastrowid or 0)

    def close_intervals(self, cluster_id: str, *, at: float | None = None) -> None:
        with self.tx() as c:
            c.execute("UPDATE cost_intervals SET stopped_at=? WHERE cluster_id=? AND stopped_at IS NULL",
                      (at or time.time(), cluster_id))

    def close_node_interval(self, cluster_id: str, node_rank: int, *, at: float) -> None:
        """End one node's open interval at ``at`` (a node that ended before the cluster did)."""
        with self.tx() as c:
            c.execute("UPDATE cost_intervals SET stopped_at=max(started_at, ?) WHERE cluster_id=? AND node_rank=?"
                      " AND stopped_at IS NULL", (at, cluster_id, node_rank))

    def set_interval_cost(self, iid: int, cost_usd: float, *, estimate: bool, note: str | None = None) -> None:
        with self.tx() as c:
            c.execute("UPDATE cost_intervals SET cost_usd=?, estimate=?, note=? WHERE id=?",
                      (cost_usd, int(estimate), _t(note), iid))

    def intervals(self, cluster_id: str | None = None) -> list[CostInterval]:
        if cluster_id:
            rows = self.conn.execute("SELECT * FROM cost_intervals WHERE cluster_id=? ORDER BY node_rank, id",
                                     (cluster_id,))
        else:
            rows = self.conn.execute("SELECT * FROM cost_intervals ORDER BY id")
        return [CostInterval(r["id"], r["cluster_id"], r["node_rank"], r["instance_type"], r["market"],
                             r["price_per_hour"], r["started_at"], r["stopped_at"], r["cost_usd"],
                             bool(r["estimate"]), r["note"]) for r in rows]
