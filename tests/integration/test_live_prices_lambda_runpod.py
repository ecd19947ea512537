"""lambda and runpod: the $/h `up` freezes is the provider's own, read at launch, and marked live: Lambda's
``price_cents_per_hour`` of the live ``GET /instance-types`` (tests/fixtures/fake_lambda.py), the pod's
``cost`` as RunPod reports it (tests/fixtures/fake_runpod.py). Both providers refuse `up` without their API
(no catalog fallback at launch: the live list is how they choose the type), so there is no estimate case here;
the offline plan says it is the bundled snapshot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gtrain
from gtrain.spec import parse_spec
from tests.fixtures.fake_lambda import TYPES, FakeLambda
from tests.fixtures.fake_runpod import FakeRunPod


def _cost(name: str) -> Any:
    return next(r for r in gtrain.cost() if r.cluster == name)


def test_lambda_freezes_its_live_instance_type_price(fake_lambda: FakeLambda, gtrain_home: Path) -> None:
    data = {"name": "lam-live", "provider": "lambda", "num_nodes": 1,
            "resources": {"accelerators": "A10:1", "region": "us-east-1"}, "lambda": {"wait_ssh": False,
                                                                                       "poll_s": 0.05}}
    res = gtrain.up(parse_spec(data))
    try:
        c = res.cluster
        assert c is not None and c.extra["price_live"] is True
        assert c.extra["price_source"].startswith("live (lambda instance-types, us-east-1, ")
        listed = {t[0]: t[2] for t in TYPES}  # what the fake's GET /instance-types answers, in cents
        assert c.price_per_hour == listed[c.instance_type] / 100 == res.plan.price_per_hour
        report = _cost("lam-live")
        assert report.price_source == c.extra["price_source"] and not report.estimate
        assert "live (lambda instance-types" in (report.lines[0].note or "")
    finally:
        gtrain.down("lam-live")


def test_runpod_freezes_the_pods_own_cost(fake_runpod: FakeRunPod, gtrain_home: Path) -> None:
    fake_runpod.cost_factor = 1.25  # the pod bills above the list price: the pod's cost is what is frozen
    data = {"name": "rp-live", "provider": "runpod", "num_nodes": 1,
            "resources": {"accelerators": "RTX4090:1", "region": "US-TX-3"},
            "runpod": {"wait_ssh": False, "poll_s": 0.05}}
    listed = gtrain.up(parse_spec(data), dry_run=True).plan.price_per_hour
    res = gtrain.up(parse_spec(data))
    try:
        c = res.cluster
        assert c is not None and c.extra["price_live"] is True
        assert c.extra["price_source"].startswith("live (runpod pod cost, US-TX-3, ")
        assert abs(c.price_per_hour - listed * 1.25) < 1e-6 and c.price_per_hour == res.plan.price_per_hour
        report = _cost("rp-live")
        assert report.price_source == c.extra["price_source"] and not report.estimate
    finally:
        gtrain.down("rp-live")
