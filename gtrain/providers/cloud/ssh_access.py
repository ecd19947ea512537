"""How gtrain reaches a cloud's nodes: who may reach port 22 (``ssh_cidr``, ``auto`` = this machine's public
/32), the plan's lines about it, ``$GTRAIN_HOME/ssh/config``, waiting until every new node answers over SSH
(host keys pinned from the cloud where it publishes them), and the end of a cloud ``down``."""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from gtrain.errors import ConfigError, ProviderError, RemoteError
from gtrain.providers.cloud.keys import drop_key

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.state import Cluster
    from gtrain.state.nodes import NodeRecord


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


def ssh_notes(ssh_cidr: str, proxy_command: str | None, section: str) -> list[str]:
    """The plan's lines about who can reach port 22."""
    if ssh_cidr == "auto" and not proxy_command:
        return [f"port 22 opened to this machine's public address only ({section}.ssh_cidr: auto)"]
    if proxy_command and ssh_cidr == "auto":
        return [f"no inbound port 22: nodes are reached through {section}.ssh_proxy_command"]
    if ssh_cidr in ("0.0.0.0/0", "::/0"):
        return [f"WARNING: port 22 is open to the whole internet ({section}.ssh_cidr: {ssh_cidr})"]
    return []


def write_ssh_config(ledger: Ledger, report: Reporter, exclude: str | None = None) -> None:
    """``$GTRAIN_HOME/ssh/config`` (``ssh <cluster>-<k>``); best effort, never fails a command."""
    from gtrain.remote.sshconfig import write_ssh_config as write

    try:
        with ledger.lock:
            write(ledger.store, exclude=exclude)
    except (OSError, TypeError, ValueError) as e:
        report.warn(f"could not write the ssh config: {e}")


def finish_down(ledger: Ledger, report: Reporter, cluster: Cluster, left: list[str], found_by: str,
                gc_cmd: str) -> None:
    """The end of a cloud ``terminate``: the cluster out of the SSH config, its local key gone, and a
    ProviderError listing whatever the final check still found (``found_by``: how it was looked for)."""
    write_ssh_config(ledger, report, exclude=cluster.id)
    drop_key(cluster.id)
    if left:
        raise ProviderError(f"{cluster.name}: resources {found_by} remain after down:\n"
                            + "\n".join(f"  - {x}" for x in left),
                            hint=f"run `gtrain down {cluster.name}` again, or `{gc_cmd}`")


def wait_ssh(cluster: Cluster, ledger: Ledger, report: Reporter, *,
             host_keys: Callable[[NodeRecord], list[str]], host_key_wait_s: float, ssh_timeout_s: float,
             poll_s: float, max_workers: int, hint: str, key_source: str) -> None:
    """Wait until every node of ``cluster`` answers over SSH (its ``ssh`` target), pinning host keys from
    ``host_keys(node)`` (the cloud's record of them) for up to ``host_key_wait_s``, else trusting on first use;
    record the address each node gives itself (``hostname -I``) for the rendezvous."""
    from gtrain.remote.ssh import pin_host_key, pinned_keys, runner_from_node

    nodes = ledger.nodes(cluster.id)

    def one(node: NodeRecord) -> str | None:
        rank, target = node.rank, node.ssh
        if target is None:
            raise RemoteError(f"node {rank} has no SSH target recorded")
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
        runner = runner_from_node(node, cluster.name, tofu=not pinned, connect_retry_s=left,
                                  on_new_host_key=lambda h, p, kt, fp: report.node(rank, f"host key {kt} {fp}"))
        runner.connect()
        # the address the node itself uses (the rendezvous binds it)
        res = runner.run("hostname -I 2>/dev/null | awk '{print $1}'", check=False, timeout=60)
        addr = res.stdout.strip()
        report.node(rank, "ssh ready")
        try:
            ipaddress.ip_address(addr)
        except ValueError:
            return None
        return addr

    errors: list[str] = []
    with ThreadPoolExecutor(min(max_workers, max(1, len(nodes)))) as pool:
        futs = [pool.submit(one, n) for n in nodes]
        for n, f in zip(nodes, futs, strict=True):
            try:
                addr = f.result()
            except RemoteError as e:
                errors.append(f"node {n.rank}: {e.message}")
                continue
            if addr and addr != n.address:
                n.address = addr
                n.extra["node_address"] = addr
                ledger.put_node(cluster.id, n)
    if errors:
        raise RemoteError("nodes are running but not reachable over SSH:\n" + "\n".join(errors), hint=hint)
