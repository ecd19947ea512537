"""The health policies in the spec, the idle rule of policies.min_gpu_util, steps/s, and the catalog's network
table."""

from __future__ import annotations

import pytest

from gtrain.catalog.network import network
from gtrain.errors import ConfigError
from gtrain.health.telemetry import NodeTelemetry, idle_for, rows
from gtrain.spec import parse_spec
from gtrain.spec.health import MinGpuUtil


def test_policies_parse_and_bad_values_name_the_field() -> None:
    s = parse_spec({"name": "x", "policies": {"preflight": "quick", "min_gpu_util": {"percent": 5, "minutes": 20,
                                                                                     "action": "stop"}}})
    assert s.policies.preflight == "quick" and s.policies.min_gpu_util == MinGpuUtil(percent=5, minutes=20,
                                                                                     action="stop")
    assert parse_spec({"name": "x"}).policies.preflight == "off"
    for bad, field in (({"preflight": "fast"}, "policies.preflight"),
                       ({"min_gpu_util": {"action": "kill"}}, "policies.min_gpu_util.action"),
                       ({"min_gpu_util": {"percent": 120}}, "policies.min_gpu_util.percent"),
                       ({"min_gpu_util": {"minutes": 5, "pct": 1}}, "policies.min_gpu_util.pct")):
        with pytest.raises(ConfigError) as e:
            parse_spec({"name": "x", "policies": bad})
        assert e.value.field == field, e.value.message


def _samples(util: float, t0: float, t1: float, gpus: int = 2, every: float = 10) -> list[dict]:  # type: ignore[type-arg]
    out, t = [], t0
    while t <= t1:
        out += [{"t": t, "gpu": g, "util": util, "mem_used": 1, "mem_total": 2, "temp": 30, "power": 50.5}
                for g in range(gpus)]
        t += every
    return out


def test_idle_only_when_every_gpu_idled_for_the_whole_window() -> None:
    policy = MinGpuUtil(percent=10, minutes=30)
    now = 10_000.0
    idle = [NodeTelemetry(0, _samples(2, now - 3600, now)), NodeTelemetry(1, _samples(0, now - 3600, now))]
    assert idle_for(idle, policy, now) == pytest.approx(3600)
    # one GPU busy 10 minutes ago: not idle long enough
    busy = [NodeTelemetry(0, _samples(2, now - 3600, now) + [{"t": now - 600, "gpu": 1, "util": 80}])]
    assert idle_for(busy, policy, now) is None
    # idle, but the samples cover only 10 minutes (the job just started): not yet
    assert idle_for([NodeTelemetry(0, _samples(0, now - 600, now))], policy, now) is None
    # a node that cannot be asked: no verdict
    assert idle_for([NodeTelemetry(0, _samples(0, now - 3600, now)), NodeTelemetry(1, error="down")], policy,
                    now) is None


def test_rows_and_steps_per_second() -> None:
    t = NodeTelemetry(0, _samples(55, 0, 20), [{"t": 100.0, "step": 10}, {"t": 104.0, "step": 30}])
    assert t.steps_per_s() == pytest.approx(5.0)
    r = rows([t, NodeTelemetry(1, error="unreachable")], now=25)
    assert r[0] == [0, 0, "55%", "1/2 MiB", "30 C", "50.5 W", "5", "5s ago"] and len(r) == 3
    assert r[2][-1] == "unreachable"
    assert NodeTelemetry(0, metrics=[{"step": 3}]).steps_per_s() is None


def test_catalog_network_column() -> None:
    p4d = network("aws", "p4d.24xlarge")
    assert p4d is not None and p4d.gbps == 400 and p4d.fabric == "efa"
    a3 = network("gcp", "a3-highgpu-8g")
    assert a3 is not None and a3.fabric == "ib"
    assert network("aws", "g4dn.xlarge").fabric is None  # type: ignore[union-attr]
    assert network("local", "local") is None and network("aws", None) is None
