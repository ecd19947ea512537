"""The AWS provider: EC2 GPU instances (on-demand or spot), reached over SSH.

Per cluster, in one region: an ed25519 key pair generated here (private key 0600 under
``$GTRAIN_HOME/keys/``, public key imported), a security group (22 from ``aws.ssh_cidr``, all traffic from
itself for NCCL and the rendezvous), a cluster placement group for multi-node clusters, and one instance per
node (EFA interface where the catalog says the type has EFA). Every resource is tagged ``gtrain:cluster`` (the
cluster id, unique for all time), ``gtrain:cluster-name``, ``gtrain:owner``, ``gtrain:created`` and
``Name=<cluster>-<rank>``; ``down`` and ``gtrain gc`` find them by tag, so a lost state database loses nothing.

Nodes are created in parallel, one ``RunInstances`` each with a ``ClientToken`` kept in the resource ledger
before the call: a retried or resumed ``up`` gets the same instance back instead of a second one. Capacity and
quota errors move on to the next zone, then the next region; each attempt is reported, and a failed attempt
leaves nothing behind.

boto3 is imported inside functions only. The constructor takes a ``boto3.Session`` (tests register botocore
event hooks on it and point it at moto through ``AWS_ENDPOINT_URL``, which boto3 honours itself). Every
botocore exception is translated into :mod:`gtrain.errors` in :func:`.api.translate`, the one place that does it.

The modules, by concern:

- :mod:`.options`: the ``aws:`` section of a spec (:class:`AWSOptions`);
- :mod:`.api`: tags, error codes and their translation, the boto3 session and EC2 clients (:class:`.api.EC2Clients`);
- :mod:`.network`: key pair, security group, placement group, subnets, image (:class:`.network.AWSNetwork`);
- :mod:`.instances`: launching one zone's nodes (idempotency tokens), waiting for them, recording them, SSH;
- :mod:`.teardown`: deleting and listing what a cluster owns, by tag;
- :mod:`.pricing`: what a node interval cost (spot price history, EBS);
- :mod:`.provider`: :class:`AWSProvider`, which owns one of each part and gives each the shared EC2 clients,
  ledger and reporter (plan, provision with failover, describe, terminate, price, gc);
- :mod:`.gc`: ``gtrain gc`` for AWS (``AWSProvider.gc``).
"""

from __future__ import annotations

from gtrain.providers.aws.api import TAG_CLUSTER
from gtrain.providers.aws.instances import host_keys_from_console
from gtrain.providers.aws.options import AWSOptions, aws_options
from gtrain.providers.aws.provider import EBS_GP3_USD_PER_GB_MONTH, AWSProvider
from gtrain.providers.cloud.billing import HOURS_PER_MONTH
from gtrain.providers.cloud.keys import key_path

__all__ = [
    "EBS_GP3_USD_PER_GB_MONTH",
    "HOURS_PER_MONTH",
    "TAG_CLUSTER",
    "AWSOptions",
    "AWSProvider",
    "aws_options",
    "host_keys_from_console",
    "key_path",
]
