"""The SSH runner: one node reached over SSH with paramiko (used by the ssh, aws and gcp providers).

* One paramiko Transport per ``(host, port, user)``, pooled at module level and shared by every runner and
  thread (a Transport multiplexes channels safely); ``close_all()`` drops them all.
* Host keys are pinned in ``$GTRAIN_HOME/ssh/known_hosts``. An unknown key is trusted on first use only by
  a runner made with ``tofu=True`` (``gtrain up``), which records it and reports its fingerprint; otherwise
  it is refused. A changed key is always refused. The same file is given to ``ssh``/``rsync``.
* paramiko is imported inside functions only: importing this package costs nothing at CLI start-up.

The modules, by concern (each depends only on those above it):

- :mod:`.target`: :class:`SSHTarget`, ``ProxyJump`` parsing, ``ProxyCommand`` expansion, OpenSSH ``Host`` blocks;
- :mod:`.hostkeys`: the pinned known_hosts file, fingerprints, the missing-host-key policy;
- :mod:`.connect`: the connection pool, proxy sockets, connecting with retries -- the one place where
  paramiko's errors become gtrain's;
- :mod:`.runner`: :class:`SSHRunner`;
- :mod:`.node`: :func:`runner_from_node`, the runner of a node recorded in state (every SSH-reached provider).
"""

from __future__ import annotations

from gtrain.remote.ssh.connect import _POOL as _POOL
from gtrain.remote.ssh.connect import (
    CONNECT_RETRY_S,
    CONNECT_TIMEOUT_S,
    KEEPALIVE_S,
    MAX_PACKET,
    WINDOW_SIZE,
    ConnectOptions,
    close_all,
    forget_host,
    pool_stats,
)
from gtrain.remote.ssh.hostkeys import (
    HostKeyCallback,
    fingerprint_sha256,
    known_hosts_name,
    known_hosts_path,
    parse_key_line,
    pin_host_key,
    pinned_keys,
    ssh_dir,
    unpin_host,
)
from gtrain.remote.ssh.hostkeys import _policy as _policy
from gtrain.remote.ssh.hostkeys import _Refused as _Refused
from gtrain.remote.ssh.node import runner_from_node
from gtrain.remote.ssh.runner import SSHRunner
from gtrain.state.sshtarget import SSHTarget, expand_proxy_command, parse_jump, ssh_config_block

# also here, private: _POOL, _policy, _Refused (tests reach for the pool's transports and the key policy)
__all__ = [
    "CONNECT_RETRY_S",
    "CONNECT_TIMEOUT_S",
    "KEEPALIVE_S",
    "MAX_PACKET",
    "WINDOW_SIZE",
    "ConnectOptions",
    "HostKeyCallback",
    "SSHRunner",
    "SSHTarget",
    "close_all",
    "expand_proxy_command",
    "fingerprint_sha256",
    "forget_host",
    "known_hosts_name",
    "known_hosts_path",
    "parse_jump",
    "parse_key_line",
    "pin_host_key",
    "pinned_keys",
    "pool_stats",
    "runner_from_node",
    "ssh_config_block",
    "ssh_dir",
    "unpin_host",
]
