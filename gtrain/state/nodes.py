"""The typed node record: what a provider knows of one node, in one shape every layer reads.

Providers fill a :class:`NodeRecord` (``store.put_node``) and read them back (``store.node_records``); nothing
outside a provider parses the free ``meta`` mapping stored with a node. Provider-private data goes in
``extra`` and stays the provider's business.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # kept off the import path of `gtrain status`
    from gtrain.state.sshtarget import SSHTarget

#: keys of the stored meta mapping that are NodeRecord fields (the rest is the provider's ``extra``)
_TYPED = ("ssh", "root", "python", "launched_at")


@dataclass
class NodeRecord:
    """One node of a cluster as its provider recorded it."""

    rank: int
    status: str
    #: the address the other nodes of the cluster reach this one on (the rendezvous address)
    address: str | None = None
    #: the provider's id of the node (an EC2 instance id, a GCE name, a local directory, ``user@host:port``)
    instance_id: str | None = None
    zone: str | None = None
    #: how gtrain reaches the node over SSH; None for nodes reached otherwise (local directories, schedulers)
    ssh: SSHTarget | None = None
    #: the node's gtrain directory (absolute, or ``~/...`` resolved on the node)
    root: str | None = None
    #: the interpreter on the node
    python: str = "python3"
    #: when the node started (epoch seconds), for the cost report; None: when ``up`` started
    launched_at: float | None = None
    #: whatever else the provider keeps about the node (hostname, GPUs, host keys, instance details)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_meta(self) -> dict[str, Any]:
        """The stored form (the ``meta`` column): the typed fields under fixed keys, plus ``extra``."""
        meta: dict[str, Any] = dict(self.extra)
        if self.ssh is not None:
            meta["ssh"] = {f.name: getattr(self.ssh, f.name) for f in fields(self.ssh)}
        if self.root is not None:
            meta["root"] = self.root
        meta["python"] = self.python
        if self.launched_at is not None:
            meta["launched_at"] = self.launched_at
        return meta

    @classmethod
    def from_stored(cls, rank: int, status: str, address: str | None, instance_id: str | None,
                    zone: str | None, meta: dict[str, Any]) -> NodeRecord:
        ssh: SSHTarget | None = None
        if meta.get("ssh"):
            from gtrain.state.sshtarget import SSHTarget

            ssh = SSHTarget(**meta["ssh"])
            team_key = os.environ.get("GTRAIN_SSH_KEY")
            if team_key and ssh.identity_file and not os.path.exists(ssh.identity_file):
                # a record another machine wrote (shared state, `gtrain attach`): its key file is not here
                ssh = dataclasses.replace(ssh, identity_file=os.path.expanduser(team_key))
        launched = meta.get("launched_at")
        return cls(
            rank=rank, status=status, address=address, instance_id=instance_id, zone=zone, ssh=ssh,
            root=meta.get("root"), python=str(meta.get("python") or "python3"),
            launched_at=float(launched) if launched is not None else None,
            extra={k: v for k, v in meta.items() if k not in _TYPED},
        )
