"""The ``gcp`` provider: Compute Engine GPU VMs (on-demand or Spot) through google-cloud-compute, reached over SSH.

Per cluster, in one project: an ed25519 key pair made here (private key 0600 under ``$GTRAIN_HOME/keys/``,
public key in each instance's ``ssh-keys`` metadata), two firewall rules aimed at the cluster's network tag
(``gtrain-<id>-ssh``: tcp 22 from ``gcp.ssh_cidr`` only; ``gtrain-<id>-int``: everything from the cluster's
own instances, for NCCL and the rendezvous), and one instance per node named ``<cluster id>-<rank>``. GPUs are
attached with ``onHostMaintenance: TERMINATE`` (N1 + T4/V100 through guestAccelerators; A2/A3/G2 have theirs
built in); Spot VMs use provisioningModel SPOT with instanceTerminationAction DELETE. Instances and their boot
disks carry the labels ``gtrain-cluster`` (the cluster id), ``gtrain-cluster-name``, ``gtrain-owner``,
``gtrain-created``, ``gtrain-rank``; ``down`` and ``gtrain gc`` find them by label, the firewall rules by name,
so a lost state database loses nothing.

google.cloud is imported inside functions only: importing this package does not import it.

The modules, by concern:

- :mod:`.options`: the ``gcp:`` section of a spec (:class:`GCPOptions`);
- :mod:`.api`: clients (endpoint override, anonymous credentials for fakes), the one place google.api_core errors
  and failed operations become gtrain errors, operation waits, labels, request bodies (:class:`.api.GCPBase`);
- :mod:`.zones`: the catalog offer, its regions, and the zones of a region that offer the machine type;
- :mod:`.instances`: launching one zone's nodes (idempotent requestIds), waiting for them, recording them, SSH;
- :mod:`.teardown`: finding instances by label and firewall rules by name, deleting them (``down`` and gc);
- :mod:`.provider`: :class:`GCPProvider` (plan, provision with failover zone -> region, describe with
  preemption, terminate, runners, price);
- :mod:`.gc`: ``gtrain gc --provider gcp``: labelled resources no live cluster owns.
"""

from gtrain.providers.gcp.options import GCPOptions, gcp_options
from gtrain.providers.gcp.provider import PD_USD_PER_GB_MONTH, GCPProvider

__all__ = ["PD_USD_PER_GB_MONTH", "GCPOptions", "GCPProvider", "gcp_options"]
