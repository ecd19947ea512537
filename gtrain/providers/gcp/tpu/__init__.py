"""Cloud TPU slices (``provider: gcp`` with ``resources.accelerators: tpu-v5p-32``): the TPU types catalog
(:mod:`.types`, data only), the TPU API v2 over REST (:mod:`.api`) and :class:`.slices.TPUSlices`, the part
:class:`~gtrain.providers.gcp.GCPProvider` hands TPU specs to. Nothing here imports an SDK at import time.
docs/providers/tpu.md."""
