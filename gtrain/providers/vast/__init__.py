"""The ``vast`` provider: Vast.ai GPU instances rented from its marketplace through its REST API (stdlib HTTP, no
SDK), reached over SSH on each instance's published ``22/tcp``.

- :mod:`.api`: the client (API key from ``VAST_API_KEY`` or the vastai CLI's ``~/.config/vastai/vast_api_key``)
  and the one place Vast's error answers become gtrain errors;
- :mod:`.offers`: the offer query, the price each offer bills, the caps (``vast.max_usd_per_hour``,
  ``policies.max_cost_usd``);
- :mod:`.options`: the ``vast:`` section of a spec;
- :mod:`.teardown`: instances found by tag (label ``gtrain-<cluster id>-<rank>``, env ``GTRAIN_CLUSTER_ID``):
  ``down``, failed ``up``, ``gc``;
- :mod:`.provider`: :class:`VastProvider`.
"""

from gtrain.providers.vast.options import VastOptions, vast_options
from gtrain.providers.vast.provider import VastProvider

__all__ = ["VastOptions", "VastProvider", "vast_options"]
