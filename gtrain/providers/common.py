"""What the cloud providers (aws, gcp) share, so each states only what is its cloud's own.

* the cluster's SSH key pair: ed25519 made here, private key 0600 under ``$GTRAIN_HOME/keys/``;
* the owner string put on every resource, and this machine's public /32 for ``ssh_cidr: auto``;
* the failover bookkeeping: each failed zone/region attempt, then one Capacity- or QuotaError that lists them;
* the billing arithmetic: per-second billing with a minimum, disk by GB-hour from a $/GB-month list price;
* waiting for every new node to answer over SSH (host keys pinned from the cloud where it publishes them);
* ``gtrain gc``'s result types;
* :class:`Ledger`: recording and marking rows of the resource ledger, one writer at a time.

No cloud SDK is imported here.
"""

from __future__ import annotations

import contextlib
import getpass
import ipaddress
import math
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gtrain.errors import CapacityError, ConfigError, GtrainError, ProviderError, QuotaError, RemoteError
from gtrain.providers.base import GCResult as GCResult  # noqa: F401 - moved to base; re-exported until callers move
from gtrain.providers.base import IntervalCost
from gtrain.providers.base import Orphan as Orphan  # noqa: F401
from gtrain.state import gtrain_home

if TYPE_CHECKING:
    import threading

    from gtrain.events import Reporter
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, CostInterval, StateStore

#: a month of disk, in hours (the clouds' own convention for $/GB-month)
HOURS_PER_MONTH = 730.0


# ---------------------------------------------------------------------------------------------- identity


def owner() -> str:
    """``user@host`` of whoever runs gtrain, put on every resource it makes."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"[:255]


# ---------------------------------------------------------------------------------------------- keys


def keys_dir() -> Path:
    d = gtrain_home() / "keys"
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(OSError):
        os.chmod(d, 0o700)
    return d


def key_path(cluster_id: str) -> Path:
    """The private key of a cluster's nodes (``.pub`` beside it)."""
    return keys_dir() / f"{cluster_id}.ed25519"


def generate_key(path: Path) -> str:
    """A new ed25519 key: private key (OpenSSH format) at ``path`` 0600; returns the public key line."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    priv = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.OpenSSH, ser.NoEncryption())
    pub = key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH).decode()
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(priv)
    os.replace(tmp, path)
    path.with_suffix(".pub").write_text(pub + "\n")
    return pub


def public_key(path: Path) -> str:
    pub = path.with_suffix(".pub")
    if pub.exists():
        return pub.read_text().strip()
    from cryptography.hazmat.primitives import serialization as ser

    key = ser.load_ssh_private_key(path.read_bytes(), password=None)
    return key.public_key().public_bytes(ser.Encoding.OpenSSH, ser.PublicFormat.OpenSSH).decode()


def ensure_key(cluster_id: str) -> str:
    """The cluster's public key line, making the key pair on first use."""
    path = key_path(cluster_id)
    if not path.exists():
        return generate_key(path)
    return public_key(path)


def drop_key(cluster_id: str) -> None:
    for p in (key_path(cluster_id), key_path(cluster_id).with_suffix(".pub")):
        with contextlib.suppress(OSError):
            p.unlink()


# ---------------------------------------------------------------------------------------------- ssh_cidr


def check_cidr(v: str) -> str:
    """``ssh_cidr`` validation shared by the provider sections: 'auto' or a network."""
    if v == "auto":
        return v
    try:
        net = ipaddress.ip_network(v, strict=False)
    except ValueError:
        raise ValueError("must be 'auto' or a CIDR such as 203.0.113.7/32") from None
    return str(net)


def detect_public_cidr(section: str = "aws", timeout: float = 3.0, proxy_hint: str = "") -> str:
    """This machine's public address as a /32 (``GTRAIN_CHECKIP_URL``, default checkip.amazonaws.com);
    ConfigError naming ``<section>.ssh_cidr`` when it cannot be found."""
    import urllib.request

    url = os.environ.get("GTRAIN_CHECKIP_URL", "https://checkip.amazonaws.com")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - fixed https URL
            text = r.read(64).decode().strip()
        ip = ipaddress.ip_address(text)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"{section}.ssh_cidr: auto could not find this machine's public address ({url}: {e})",
            hint=f"set {section}.ssh_cidr to your address, e.g. 203.0.113.7/32 (never 0.0.0.0/0 unless you mean "
                 f"it), or use {section}.ssh_proxy_command{proxy_hint} and no port 22 is opened",
            field=f"{section}.ssh_cidr",
        ) from None
    return f"{ip}/{ip.max_prefixlen}"


def resolve_ssh_cidr(ssh_cidr: str, proxy_command: str | None, section: str, proxy_hint: str = "") -> str | None:
    """The source range of the port-22 rule: the one written, this machine's /32 for 'auto', or None (no
    port 22 at all) for 'auto' with a proxy command."""
    if ssh_cidr != "auto":
        return ssh_cidr
    if proxy_command:
        return None
    return detect_public_cidr(section, proxy_hint=proxy_hint)


#: powers the node off: on EC2 that terminates it (InstanceInitiatedShutdownBehavior), on GCE it stops it
IDLE_COMMAND = ("sudo", "-n", "shutdown", "-h", "now")
IDLE_PIDFILE = "~/.gtrain-idle-watch.pid"


def start_idle_watch(runners: list[Any], idle_minutes: float, command: list[str], report: Reporter,
                     max_workers: int = 16) -> None:
    """Start ``nodeside.idle_watch`` detached on every node: it runs ``command`` once the node has had no
    gtrain job process and no interactive SSH login for ``idle_minutes`` (one watcher per node: starting it
    again is a no-op). The nodes hold the policy themselves, with no laptop and no gtrain process left."""
    import shlex

    from gtrain.remote.base import nodeside_source

    idle_s = max(1, int(idle_minutes * 60))
    poll_s = max(1, min(30, idle_s // 4))
    src = nodeside_source().encode()

    def one(r: Any) -> None:
        args = [r.python, "-", "idle_watch", str(idle_s), str(poll_s), IDLE_PIDFILE, *command]
        r.start_detached(" ".join(map(shlex.quote, args)) + ' >>"$HOME/.gtrain-idle-watch.log" 2>&1', stdin=src)

    with ThreadPoolExecutor(min(max_workers, max(1, len(runners)))) as pool:
        for f in [pool.submit(one, r) for r in runners]:
            f.result()
    report.info(f"idle watch on {len(runners)} node(s): `{' '.join(command)}` after {idle_minutes:g} min with "
                "no job and no SSH login (policies.idle_minutes)")


def lifetime_s(policies: Any, num_nodes: int, price_per_hour: float | None) -> int | None:
    """How long a cloud node may live, in whole seconds (at least 60), from ``policies.max_hours`` and
    ``policies.max_cost_usd`` (the cluster's budget spread over its nodes at their $/h: a cost cap becomes a
    time cap), or None when neither is set. The nodes enforce it themselves, so it holds with no laptop and no
    gtrain process left (see the aws and gcp providers)."""
    caps: list[float] = []
    if policies.max_hours:
        caps.append(float(policies.max_hours) * 3600)
    if policies.max_cost_usd and price_per_hour and price_per_hour > 0:
        caps.append(float(policies.max_cost_usd) / (price_per_hour * max(1, num_nodes)) * 3600)
    if not caps:
        return None
    return max(60, int(min(caps)))


def lifetime_note(seconds: int | None, how: str) -> list[str]:
    if seconds is None:
        return []
    return [f"each node deletes itself {seconds / 3600:.2f} h after it starts ({how}; policies.max_hours / "
            "max_cost_usd), whatever happens to this machine"]


def ssh_notes(ssh_cidr: str, proxy_command: str | None, section: str) -> list[str]:
    """The plan's lines about who can reach port 22."""
    if ssh_cidr == "auto" and not proxy_command:
        return [f"port 22 opened to this machine's public address only ({section}.ssh_cidr: auto)"]
    if proxy_command and ssh_cidr == "auto":
        return [f"no inbound port 22: nodes are reached through {section}.ssh_proxy_command"]
    if ssh_cidr in ("0.0.0.0/0", "::/0"):
        return [f"WARNING: port 22 is open to the whole internet ({section}.ssh_cidr: {ssh_cidr})"]
    return []


# ---------------------------------------------------------------------------------------------- failover


@dataclass
class Attempts:
    """Where ``up`` tried and why it failed there; :meth:`fail` raises the one error that lists them."""

    items: list[str] = field(default_factory=list)
    all_quota: bool = True

    def add(self, where: str, err: GtrainError | str) -> None:
        if isinstance(err, GtrainError):
            self.all_quota &= isinstance(err, QuotaError)
            self.items.append(f"{where}: {err.message}")
        else:
            self.items.append(f"{where}: {err}")

    def fail(self, what: str, *, quota_hint: str, capacity_hint: str) -> NoReturn:
        if self.items and self.all_quota:
            raise QuotaError(f"no quota for {what} in any region tried:\n" + "\n".join(f"  - {a}" for a in self.items),
                             hint=quota_hint)
        raise CapacityError(f"no capacity for {what} in any zone or region tried", self.items, hint=capacity_hint)


# ---------------------------------------------------------------------------------------------- billing


def billed_seconds(seconds: float, minimum_s: float) -> int:
    """Per-second billing with a minimum (EC2 and GCE: 60 s) for an interval that ran at all."""
    if seconds <= 0:
        return 0
    return math.ceil(max(seconds, minimum_s))


def disk_cost(disk_gb: float, usd_per_gb_month: float, billed_s: float) -> float:
    """A disk's cost over ``billed_s`` seconds at a $/GB-month list price (730 h a month)."""
    return disk_gb * usd_per_gb_month / HOURS_PER_MONTH * billed_s / 3600.0


def cloud_interval_cost(interval: CostInterval, *, minimum_s: float, spot: tuple[float, bool, str] | None,
                        disk_gb: float, disk_usd_per_gb_month: float, disk_label: str) -> IntervalCost:
    """One node interval's cost on a per-second cloud: compute at the on-demand $/h stored at start (or the
    provider's ``spot`` (rate, is_estimate, note)), plus the boot disk by GB-hour, with the billing minimum."""
    stop = interval.stopped_at or time.time()
    seconds = max(0.0, stop - interval.started_at)
    billed = billed_seconds(seconds, minimum_s)
    if interval.market == "spot" and spot is not None:
        rate, estimate, note = spot
        notes = [note]
    else:
        rate, estimate = interval.price_per_hour, False
        notes = [f"on-demand ${rate:g}/h stored at start"]
    disk = disk_cost(disk_gb, disk_usd_per_gb_month, billed)
    if seconds and seconds < minimum_s:
        notes.append(f"billed the {minimum_s:.0f} s minimum")
    if disk_gb:
        notes.append(f"{disk_label} {disk_gb:g} GB ${disk:.6f}")
    return IntervalCost(round(billed * rate / 3600.0 + disk, 6), estimate=estimate, note="; ".join(notes))


# ---------------------------------------------------------------------------------------------- ssh


def finish_down(store: StateStore, report: Reporter, lock: Any, cluster: Cluster, left: list[str], found_by: str,
                gc_cmd: str) -> None:
    """The end of a cloud ``terminate``: the cluster out of the SSH config, its local key gone, and a
    ProviderError listing whatever the final check still found (``found_by``: how it was looked for)."""
    write_ssh_config(store, report, lock, exclude=cluster.id)
    drop_key(cluster.id)
    if left:
        raise ProviderError(f"{cluster.name}: resources {found_by} remain after down:\n"
                            + "\n".join(f"  - {x}" for x in left),
                            hint=f"run `gtrain down {cluster.name}` again, or `{gc_cmd}`")


def write_ssh_config(store: StateStore, report: Reporter, lock: Any, exclude: str | None = None) -> None:
    """``$GTRAIN_HOME/ssh/config`` (``ssh <cluster>-<k>``); best effort, never fails a command."""
    from gtrain.remote.sshconfig import write_ssh_config as write

    try:
        with lock:
            write(store, exclude=exclude)
    except (OSError, TypeError, ValueError) as e:
        report.warn(f"could not write the ssh config: {e}")


def wait_ssh(cluster: Cluster, store: StateStore, report: Reporter, lock: Any, *, host_keys: Callable[[Any], list[str]],
             host_key_wait_s: float, ssh_timeout_s: float, poll_s: float, max_workers: int, hint: str,
             key_source: str) -> None:
    """Wait until every node of ``cluster`` answers over SSH (its ``meta["ssh"]`` target), pinning host keys
    from ``host_keys(node)`` (the cloud's record of them) for up to ``host_key_wait_s``, else trusting on
    first use; record the address each node gives itself (``hostname -I``) for the rendezvous."""
    from gtrain.remote.ssh import SSHRunner, SSHTarget, pin_host_key, pinned_keys

    nodes = store.nodes(cluster.id)

    def one(node: Any) -> tuple[int, str | None]:
        rank = node.rank
        target = SSHTarget(**node.meta["ssh"])
        started = time.monotonic()
        pinned = bool(pinned_keys(target.host, target.port))
        while not pinned and time.monotonic() - started < host_key_wait_s:
            lines = host_keys(node)
            if lines:
                for line in lines:
                    pin_host_key(target.host, target.port, line)
                pinned = True
                report.node(rank, f"host keys pinned from {key_source} ({len(lines)})")
                break
            time.sleep(min(5.0, poll_s))
        if not pinned:
            report.node(rank, f"no host keys in {key_source}; trusting the key on first use")
        left = max(5.0, ssh_timeout_s - (time.monotonic() - started))
        runner = SSHRunner(target, cluster=cluster.name, label=f"node {rank}", tofu=not pinned, connect_retry_s=left,
                           on_new_host_key=lambda h, p, kt, fp: report.node(rank, f"host key {kt} {fp}"))
        runner.connect()
        # the address the node itself uses (the rendezvous binds it)
        res = runner.run("hostname -I 2>/dev/null | awk '{print $1}'", check=False, timeout=60)
        addr = res.stdout.strip()
        report.node(rank, "ssh ready")
        try:
            ipaddress.ip_address(addr)
        except ValueError:
            return rank, None
        return rank, addr

    errors: list[str] = []
    with ThreadPoolExecutor(min(max_workers, max(1, len(nodes)))) as pool:
        futs = [pool.submit(one, n) for n in nodes]
        for n, f in zip(nodes, futs, strict=True):
            try:
                rank, addr = f.result()
            except RemoteError as e:
                errors.append(f"node {n.rank}: {e.message}")
                continue
            if addr and addr != n.address:
                with lock:
                    store.upsert_node(cluster.id, rank, status=n.status, address=addr,
                                      meta={**n.meta, "node_address": addr})
    if errors:
        raise RemoteError("nodes are running but not reachable over SSH:\n" + "\n".join(errors), hint=hint)


# ---------------------------------------------------------------------------------------------- the ledger


class Ledger:
    """The resource ledger helpers of a cloud provider's base; needs ``store`` and ``_store_lock`` (one sqlite
    connection: one writer at a time)."""

    store: StateStore
    _store_lock: threading.RLock

    def _record(self, cluster: Cluster, kind: str, ref: str, region: str, meta: dict[str, Any] | None = None) -> int:
        with self._store_lock:
            return self.store.record_resource(cluster.id, kind, ref, region=region, meta=meta)

    def _mark(self, rid: int, status: str, **kw: Any) -> None:
        with self._store_lock:
            self.store.mark_resource(rid, status, **kw)


def live_cluster_ids(store: StateStore, provider: str) -> set[str]:
    """Ids of the clusters of ``provider`` that state still owns (anything not terminated)."""
    return {c.id for c in store.list_clusters() if c.provider == provider}


class IdleWatch:
    """Mixin for the cloud providers: ``policies.idle_minutes`` becomes a watcher on every node."""

    report: Reporter
    _max_workers: int

    def _idle_watch(self, spec: ClusterSpec, cluster: Cluster, opts: CloudOptions) -> None:
        minutes = spec.policies.idle_minutes
        if not minutes:
            return
        if not opts.wait_ssh:
            self.report.warn("policies.idle_minutes needs SSH to the nodes to start their idle watch, and "
                             f"{spec.provider}.wait_ssh is false: it is not enforced on this cluster")
            return
        runners = self.runners(cluster)  # type: ignore[attr-defined]  # the Provider's
        start_idle_watch(runners, minutes, opts.idle_command, self.report, self._max_workers)


class CloudOptions(BaseModel):
    """What the cloud sections (``aws:``, ``gcp:``) share: who may reach port 22, how gtrain gets there,
    how long it waits. Subclasses say what ``%h`` is in their proxy command."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)
    proxy_host: ClassVar[str] = "the instance"
    proxy_example: ClassVar[str] = "ssh -W %h:22 bastion"

    ssh_cidr: str = Field("auto", description="who may reach port 22: 'auto' = this machine's public /32")
    ssh_proxy_command: str | None = Field(None, description="OpenSSH ProxyCommand; %h = the instance")
    wait_ssh: bool = Field(True, description="wait until every node answers over SSH")
    ssh_timeout_s: float = Field(900, gt=0)
    poll_s: float = Field(2.0, gt=0, le=60)
    idle_command: list[str] = Field(default_factory=lambda: list(IDLE_COMMAND), min_length=1,
                                    description="what a node runs once policies.idle_minutes is up")

    @field_validator("ssh_cidr")
    @classmethod
    def _cidr(cls, v: str) -> str:
        return check_cidr(v)

    @field_validator("ssh_proxy_command")
    @classmethod
    def _proxy(cls, v: str | None) -> str | None:
        if v is not None and "%h" not in v:
            raise ValueError(f"must contain %h ({cls.proxy_host}), e.g. '{cls.proxy_example}'")
        return v
