"""`gtrain attach` on a provider that cannot find clusters by tags: the hint names the ones that can, read from
the registered classes (no list kept by hand)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gtrain.errors import ConfigError
from gtrain.providers import attach_providers, get_provider
from gtrain.spec import parse_spec
from gtrain.state import StateStore


def test_the_hint_names_every_provider_that_overrides_find_by_name(gtrain_home: Path) -> None:
    able = attach_providers()
    assert {"aws", "gcp", "kubernetes", "nebius", "runpod", "slurm", "vast"} <= set(able)
    assert "local" not in able and "lambda" not in able
    store = StateStore()
    try:
        with pytest.raises(ConfigError) as e:
            get_provider("lambda", store).find_by_name(parse_spec({"name": "x", "provider": "lambda"}), [])
        assert e.value.field == "--provider" and f"attach knows {', '.join(able)}" in (e.value.hint or "")
    finally:
        store.close()
