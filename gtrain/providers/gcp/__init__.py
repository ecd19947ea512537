"""The ``gcp`` provider: Compute Engine VMs through google-cloud-compute (imported lazily).

    provider.py   GCPProvider: plan, provision (failover zone -> region), describe (preemption), runners, price
    api.py        clients (endpoint override, anonymous credentials for fakes), the one place google.api_core
                  errors and failed operations become gtrain errors, operation waits, request bodies
    teardown.py   find instances by label and firewall rules by name, delete them (down and gc)
    gc.py         `gtrain gc --provider gcp`: labelled resources no live cluster owns
"""

from gtrain.providers.gcp.provider import GCPProvider, gcp_options

__all__ = ["GCPProvider", "gcp_options"]
