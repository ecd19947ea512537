"""Cloud TPU slices, offline: the types catalog, the spec (``resources.accelerators: tpu-...``), the plan,
`gtrain catalog --tpu`, `up --dry-run`, bad input (exit 2 naming the field), the TPU API's errors translated, and
the launch environment. The TPU API itself is exercised at the wire in tests/integration/test_tpu*.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gtrain.errors import CapacityError, ConfigError, CredentialsError, QuotaError
from gtrain.providers.gcp.tpu.api import translate_status
from gtrain.providers.gcp.tpu.types import lookup, topology_chips, tpu_types
from gtrain.spec import parse_spec


def gtrain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def tpu_spec(accel: str = "tpu-v5p-32", **top: object) -> dict[str, object]:
    return {"name": "slice", "provider": "gcp", "resources": {"accelerators": accel, "use_spot": True}, **top}


def test_types_chips_hosts_and_prices() -> None:
    t = lookup("TPU-v5p-32")
    assert (t.name, t.chips, t.hosts, t.chips_per_host, t.generation) == ("tpu-v5p-32", 16, 4, 4, "v5p")
    assert t.price_per_host_hour(False) == pytest.approx(4 * t.price_ondemand_chip_h)
    assert t.price_per_hour(True) == pytest.approx(16 * t.price_spot_chip_h)
    assert lookup("tpu-v5litepod-16").hosts == 4 and lookup("tpu-v4-8").hosts == 1
    for t in tpu_types().values():  # every row is whole: chips split evenly over hosts, in some zone, priced
        assert t.chips % t.hosts == 0 and t.zones and 0 < t.price_spot_chip_h < t.price_ondemand_chip_h
    assert topology_chips("2x2x4") == 16
    with pytest.raises(ValueError, match="not a TPU topology"):
        topology_chips("2by2")


def test_spec_takes_the_hosts_as_nodes_and_has_no_gpus() -> None:
    s = parse_spec(tpu_spec())
    assert (s.num_nodes, s.resources.accelerators, s.resources.gpus_per_node) == (4, "tpu-v5p-32", 0)
    assert s.resources.accelerator_env() == {"PJRT_DEVICE": "TPU"}
    assert parse_spec({**tpu_spec(), "num_nodes": 4}).num_nodes == 4
    assert parse_spec({"name": "g", "resources": {"accelerators": "a100:8"}}).resources.accelerator_env() == {}


@pytest.mark.parametrize(("spec", "field"), [
    (tpu_spec("tpu-v9-8"), "resources.accelerators"),
    ({**tpu_spec(), "num_nodes": 2}, "num_nodes"),
])
def test_bad_slice_specs_name_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_spec(spec)
    assert field in e.value.message


def test_plan_shows_hosts_chips_zone_and_price_offline() -> None:
    from gtrain.providers.gcp.provider import GCPProvider
    from gtrain.state import StateStore

    plan = GCPProvider(StateStore()).plan(parse_spec({**tpu_spec(), "gcp": {"queued": True}}))
    assert (plan.num_nodes, plan.instance_type, plan.market, plan.zone) == (4, "tpu-v5p-32", "spot", "us-east5-a")
    assert plan.price_per_hour == pytest.approx(4 * lookup("tpu-v5p-32").price_spot_chip_h)
    assert plan.gpus_per_node == 4 and "16 TPU v5p chips" in plan.notes[0] and "queued resource" in plan.notes[0]


def test_up_dry_run_of_a_spot_v5p_32_offline_then_bad_runtime_exits_2(tmp_path: Path, gtrain_home: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(json.dumps(tpu_spec()))
    r = gtrain("up", str(p), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "tpu-v5p-32" in r.stdout and "us-east5-a" in r.stdout and "$30.24" in r.stdout, r.stdout
    assert "4 worker host(s) x 4 chip(s) = 16 TPU v5p chips" in r.stdout
    p.write_text(json.dumps({**tpu_spec(), "gcp": {"runtime_version": "v2-alpha-tpuv6e"}}))
    r = gtrain("up", str(p), "--dry-run")
    assert r.returncode == 2 and "gcp.runtime_version" in r.stderr and "Traceback" not in r.stderr, r.stderr
    import gtrain as api

    assert api.status() == []  # nothing made


def test_catalog_tpu_lists_types() -> None:
    r = gtrain("catalog", "--tpu", "--json")
    assert r.returncode == 0, r.stderr
    rows = {t["name"]: t for t in json.loads(r.stdout)["tpu_types"]}
    assert set(rows) == set(tpu_types())
    assert rows["tpu-v4-16"]["hosts"] == 2 and rows["tpu-v4-16"]["chips_per_host"] == 4
    assert rows["tpu-v4-16"]["zones"] == ["us-central2-b"]


def test_tpu_api_errors_become_gtrains() -> None:
    assert isinstance(translate_status("RESOURCE_EXHAUSTED", "There is no more capacity in the zone", 429, "x"),
                      CapacityError)
    assert isinstance(translate_status("RESOURCE_EXHAUSTED", "Quota 'TPUV5P' exceeded", 429, "x"), QuotaError)
    e = translate_status("INVALID_ARGUMENT", "Invalid runtime version 'x'", 400, "nodes.create")
    assert isinstance(e, ConfigError) and e.field == "gcp.runtime_version"
    assert isinstance(translate_status("PERMISSION_DENIED", "no", 403, "x"), CredentialsError)


def test_health_counts_jax_devices_per_worker_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """JAX on CPU with 4 forced host devices stands in for a TPU host's chips: the count is checked against the
    type's chips per host (v4: 4 → right count, but CPU devices: a warning, no libtpu; v5litepod-8: 8 → a
    failure); a host without JAX fails."""
    from gtrain.health.model import Verdict
    from gtrain.health.tpu import probe, tpu_checks, verdict
    from gtrain.remote.local import LocalRunner

    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    s = parse_spec({"name": "h", "provider": "gcp", "resources": {"accelerators": "tpu-v4-16"},
                    "job": {"run": "x.py", "python": sys.executable}})
    [c] = tpu_checks(s, [LocalRunner(tmp_path, label="node-0")])
    assert (c.name, c.verdict, c.figure, c.data) == ("tpu.chips", Verdict.WARN, "4/4 cpu",
                                                     {"count": 4, "platform": "cpu"}), c
    assert (verdict("tpu-v5litepod-8", 8, 0, c.data).verdict, verdict("tpu-v5litepod-8", 8, 0, c.data).figure) \
        == (Verdict.FAIL, "4/8")
    assert verdict("tpu-v4-16", 4, 0, {"count": 4, "platform": "tpu"}).verdict == Verdict.OK
    no_jax = probe(LocalRunner(tmp_path), "/bin/false")
    assert verdict("tpu-v4-16", 4, 1, no_jax).verdict == Verdict.FAIL and "exit 1" in str(no_jax["error"])
