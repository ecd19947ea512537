"""The runner of a node recorded in state: one place for every provider whose nodes are reached over SSH
(ssh, aws, gcp, the next VM cloud)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gtrain.errors import RemoteError
from gtrain.remote.ssh.runner import SSHRunner

if TYPE_CHECKING:
    from gtrain.state.nodes import NodeRecord

#: a node that was up: give up on it after this many seconds of failed connects (``up`` waits longer for boots)
UP_NODE_RETRY_S = 10.0


def runner_from_node(node: NodeRecord, cluster_name: str, *, label: str | None = None, **kw: Any) -> SSHRunner:
    """An :class:`SSHRunner` for ``node`` (its ``ssh`` target, root, python and address); ``kw`` goes to the
    runner (``tofu``, ``on_new_host_key``, ``connect_retry_s`` while a node boots)."""
    if node.ssh is None:
        raise RemoteError(f"node {node.rank} of {cluster_name} is not reached over SSH (no target recorded)")
    kw.setdefault("connect_retry_s", UP_NODE_RETRY_S)
    return SSHRunner(node.ssh, cluster=cluster_name, root=node.root, label=label or f"node {node.rank}",
                     address=node.address or node.ssh.host, python=node.python, **kw)
