"""The ``nebius`` provider: Nebius AI Cloud GPU VMs through its gRPC API and the official SDK (``gtrain[nebius]``,
imported lazily), reached over SSH at each instance's public address.

- :mod:`.api`: the SDK connection (``NEBIUS_IAM_TOKEN`` or a profile of ``~/.nebius/config.yaml``) and the one
  place gRPC status codes become gtrain errors;
- :mod:`.gpus`: platforms, presets and the dated price table (the fallback of the live calculator price);
- :mod:`.options`: the ``nebius:`` section of a spec;
- :mod:`.teardown`: instances and GPU clusters found by label (``gtrain-cluster``): ``down``, failed ``up``,
  ``gc``;
- :mod:`.provider`: :class:`NebiusProvider`.
"""

from gtrain.providers.nebius.options import NebiusOptions, nebius_options
from gtrain.providers.nebius.provider import NebiusProvider

__all__ = ["NebiusOptions", "NebiusProvider", "nebius_options"]
