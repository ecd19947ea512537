"""The ``azure`` provider: Azure GPU VMs (on-demand or Spot) through Azure Resource Manager's REST API, reached
over SSH.

Per cluster: one resource group ``gtrain-<cluster id>`` holding everything (so ``down`` is one delete, polled
to the end, and nothing can leak outside it): a network security group (tcp 22 from ``azure.ssh_cidr`` only),
a virtual network, and per node a public IP, a NIC and a VM named ``<cluster id>-<rank>``, all tagged
``gtrain-cluster``. No Azure SDK is imported by this package: ARM is spoken over stdlib HTTPS (:mod:`.api`;
docs/providers/azure.md says why, with measurements), tokens come from azure-identity, imported on first use.

- :mod:`.options`: the ``azure:`` section (:class:`AzureOptions`);
- :mod:`.api`: the ARM client (429 / Retry-After, long-running operations), error translation;
- :mod:`.resources`: the resource group, network and node bodies;
- :mod:`.provider`: :class:`AzureProvider`; :mod:`.gc`: orphaned resource groups by tag;
- :mod:`.prices`: catalog rows from the Azure Retail Prices API.
"""

from gtrain.providers.azure.options import AzureOptions, azure_options
from gtrain.providers.azure.provider import DISK_USD_PER_GB_MONTH, AzureProvider

__all__ = ["DISK_USD_PER_GB_MONTH", "AzureOptions", "AzureProvider", "azure_options"]
