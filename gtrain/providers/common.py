"""Deprecated: split by concern into :mod:`gtrain.providers.cloud`. Only ``lifetime_s`` is still imported from
here (``gtrain/cluster.py`` until it asks ``Provider.ended_at``; ``tests/unit/test_cost.py``); delete this
module once nothing does."""

from gtrain.providers.cloud.lifetime import lifetime_s

__all__ = ["lifetime_s"]
