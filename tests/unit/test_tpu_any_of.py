"""``resources.any_of`` with a Cloud TPU candidate, offline: the candidate's plain spec takes the slice's host
count as num_nodes (the GPU candidates keep the spec's), the candidates are priced side by side at $/chip-hour x
chips, and a num_nodes given that does not match the slice exits 2 naming the fields."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gtrain.errors import ConfigError
from gtrain.registry import accelerator_shape
from gtrain.runs.placement import candidate_specs
from gtrain.spec import parse_spec


def spec(**top: object) -> dict[str, object]:
    return {"name": "mix", "resources": {"any_of": [
        {"provider": "gcp", "accelerators": "tpu-v5p-32", "use_spot": True},
        {"provider": "gcp", "accelerators": "A100:8", "region": "us-central1"},
        {"provider": "gcp", "accelerators": "tpu-v4-16"}]}, **top}


def test_a_slice_candidate_takes_its_host_count_and_the_spec_round_trips() -> None:
    s = parse_spec(spec())
    assert s.num_nodes == 1 and "num_nodes" not in s.to_yaml_dict()
    tpu, gpu, v4 = candidate_specs(s)
    assert (tpu.num_nodes, gpu.num_nodes, v4.num_nodes) == (4, 1, 2)
    again = candidate_specs(parse_spec(s.to_yaml_dict()))  # what a move re-reads from the cluster's record
    assert [c.num_nodes for c in again] == [4, 1, 2]
    s4 = parse_spec({**spec(), "num_nodes": 4, "resources": {"any_of": [
        {"provider": "gcp", "accelerators": "tpu-v5p-32"}, {"provider": "gcp", "accelerators": "A100:8"}]}})
    assert [c.num_nodes for c in candidate_specs(s4)] == [4, 4]  # given and matching: every candidate has it


def test_a_num_nodes_that_does_not_match_a_slice_candidate_names_the_fields() -> None:
    with pytest.raises(ConfigError) as e:
        parse_spec(spec(num_nodes=2))
    assert "num_nodes: 2" in e.value.message and "resources.any_of[0].accelerators tpu-v5p-32" in e.value.message
    assert "set it to 4" in e.value.message


def test_candidates_are_priced_side_by_side_per_chip_hour(tmp_path: Path, gtrain_home: Path) -> None:
    from gtrain.context import Context
    from gtrain.runs.placement import offers
    from gtrain.state import StateStore

    got = {o.label: o for o in offers(parse_spec(spec()), Context(store=StateStore()))}
    tpu = next(o for k, o in got.items() if k.startswith("#1"))
    v5p = accelerator_shape("tpu-v5p-32")
    assert tpu.plan is not None and tpu.plan.num_nodes == 4 and tpu.plan.gpus_per_node == 4
    assert tpu.plan.cluster_price_per_hour == pytest.approx(v5p.price_per_hour(True))  # 16 chips x spot $/chip-h
    assert tpu.to_dict()["cluster_price_per_hour"] == pytest.approx(16 * v5p.price_spot_chip_h, abs=1e-3)
    v4 = next(o for k, o in got.items() if k.startswith("#3"))
    assert v4.plan is not None and v4.plan.cluster_price_per_hour == pytest.approx(
        accelerator_shape("tpu-v4-16").price_per_hour(False))
    # the CLI: exit 2, the field named, no traceback, nothing made
    p = tmp_path / "s.yaml"
    p.write_text(json.dumps(spec(num_nodes=3)))
    r = subprocess.run([sys.executable, "-m", "gtrain", "up", str(p), "--dry-run"], capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "num_nodes: 3" in r.stderr and "any_of[0].accelerators" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_broken_user_copy_of_the_types_names_the_file(gtrain_home: Path) -> None:
    """A hand-edited `$GTRAIN_HOME/catalog/tpu.csv` that does not parse: exit 2 naming it and the way back."""
    bad = gtrain_home / "catalog" / "tpu.csv"
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_text("# snapshot: 2026-01-01\naccelerator_type,generation\nv5p-32,v5p\n")
    with pytest.raises(ConfigError) as e:
        parse_spec({"name": "x", "provider": "gcp", "resources": {"accelerators": "tpu-v5p-32"}})
    assert str(bad) in e.value.message and "delete it" in (e.value.hint or "")
    bad.unlink()
    assert parse_spec({"name": "x", "provider": "gcp", "resources": {"accelerators": "tpu-v5p-32"}}).num_nodes == 4
