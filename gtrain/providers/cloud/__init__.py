"""What the VM clouds (aws, gcp) share, one concern per module, so each cloud states only what is its own.

- :mod:`.keys`: the owner string on every resource and the cluster's key pair under ``$GTRAIN_HOME/keys``
  (ed25519; RSA where a cloud takes only RSA: azure);
- :mod:`.options`: :class:`~.options.CloudOptions`, the fields every cloud section has (``ssh_cidr``, ...);
- :mod:`.ssh_access`: who may reach port 22, the SSH config, waiting for nodes over SSH, the end of ``down``;
- :mod:`.failover`: :class:`~.failover.Attempts`, where ``up`` tried and the one error that lists them;
- :mod:`.billing`: per-second billing with a minimum, disks by GB-hour;
- :mod:`.lifetime`: ``policies.max_hours`` / ``max_cost_usd`` as a node lifetime, and when such nodes ended;
- :mod:`.idle`: ``policies.idle_minutes`` as a watcher on every node;
- :mod:`.ledger`: :class:`~.ledger.Ledger`, the resource ledger and node records behind one writer lock;
- :mod:`.provider`: :class:`~.provider.CloudProvider`, the capabilities every VM cloud has.

No cloud SDK is imported here, and nothing in this package imports a provider.
"""
