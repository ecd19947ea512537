"""The ``runpod`` provider: RunPod GPU pods through its REST API v2 (stdlib HTTP, no SDK), reached over SSH on
each pod's published ``22/tcp``.

- :mod:`.api`: the client (API key from ``RUNPOD_API_KEY`` or runpodctl's ``~/.runpod/config.toml``) and the one
  place RunPod's problem+json answers become gtrain errors;
- :mod:`.gpus`: the live GPU catalog (list prices per GPU and cloud) and the type a spec asks for;
- :mod:`.options`: the ``runpod:`` section of a spec;
- :mod:`.teardown`: pods found by tag (name ``gtrain-<cluster id>-<rank>``, env ``GTRAIN_CLUSTER_ID``): ``down``,
  failed ``up``, ``gc``;
- :mod:`.provider`: :class:`RunPodProvider`.
"""

from gtrain.providers.runpod.options import RunPodOptions, runpod_options
from gtrain.providers.runpod.provider import RunPodProvider

__all__ = ["RunPodOptions", "RunPodProvider", "runpod_options"]
