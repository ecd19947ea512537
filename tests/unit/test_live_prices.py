"""The frozen price's record (gtrain.providers.cloud.billing: live vs estimate, the fallback and why, what `up`
records) and the node's own budget watch (aws/nodebudget.py: the arithmetic, SigV4 as botocore signs)."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest

from gtrain.errors import ProviderError
from gtrain.providers.aws import nodebudget
from gtrain.providers.base import Plan
from gtrain.providers.cloud.billing import (
    catalog_price,
    cloud_interval_cost,
    freeze_price,
    live_or_catalog,
    live_price,
    price_fields,
    price_label,
)
from gtrain.state import CostInterval, StateStore


def test_labels_name_the_source_place_and_moment() -> None:
    at = dt.datetime(2026, 12, 6, 14, 0, 31, tzinfo=dt.UTC)
    live = live_price(0.3712, "aws spot price history", "us-east-1a", at)
    assert live.label == "live (aws spot price history, us-east-1a, 2026-12-06T14:00Z)"
    assert live.note() == "price: $0.3712/h per node, live (aws spot price history, us-east-1a, 2026-12-06T14:00Z)"
    est = catalog_price(0.4024, "2025-12", "HTTP 503")
    assert est.label == "estimate (catalog 2025-12)" and est.note().endswith("the live price was not had: HTTP 503")
    assert price_fields(live) == {"price_per_hour": 0.3712, "price_live": True, "price_source": live.label}
    assert price_label(price_fields(est)) == est.label and price_label({}) is None


@pytest.mark.parametrize(("fetch", "why"), [
    (lambda: (_ for _ in ()).throw(ProviderError("HTTP 429 throttled")), "HTTP 429 throttled"),
    (lambda: (_ for _ in ()).throw(OSError("connection refused")), "OSError: connection refused"),
    (lambda: (_ for _ in ()).throw(KeyError("Items")), "KeyError"),
    (lambda: None, "no price for this type here"),
    (lambda: live_price(0.0, "x"), "answered $0.0/h"),
    (lambda: live_price(math.nan, "x"), "answered $nan/h"),
])
def test_the_catalog_when_the_live_price_is_not_had(fetch: Any, why: str) -> None:
    got = live_or_catalog(fetch, catalog_price(1.5, "2025-12"))
    assert (got.usd_per_hour, got.live, got.source) == (1.5, False, "catalog 2025-12")
    assert why in (got.why or "")


def test_freeze_price_sets_the_plan_the_cluster_and_its_record() -> None:
    store = StateStore()
    try:
        plan = Plan(provider="aws", num_nodes=2, instance_type="g5.xlarge", market="spot", price_per_hour=0.40,
                    notes=["a note", "price: $0.40/h per node, estimate (catalog 2025-12)"])
        c = store.create_cluster(name="fp", provider="aws", num_nodes=2, spec={}, region="us-east-1",
                                 instance_type="g5.xlarge", market="spot", price_per_hour=0.40,
                                 extra={"base_dir": "/x", "plan": plan.to_dict()})
        said: list[str] = []
        report = type("R", (), {"info": lambda self, m: said.append(m)})()
        live = live_price(0.3712, "aws spot price history", "us-east-1a")
        freeze_price(store, c, plan, live, report)  # type: ignore[arg-type]
        again = store.get_cluster_by_id(c.id)
        assert again is not None and again.price_per_hour == 0.3712 == plan.price_per_hour == c.price_per_hour
        assert again.extra["price_live"] is True and again.extra["price_source"] == live.label
        assert again.extra["base_dir"] == "/x" and again.extra["plan"]["price_per_hour"] == 0.3712
        assert plan.notes == ["a note", live.note()] and said == [live.note()]  # the earlier price line replaced
    finally:
        store.close()


def _interval(market: str, price: float) -> CostInterval:
    return CostInterval(id=1, cluster_id="c", node_rank=0, instance_type="t", market=market, price_per_hour=price,
                        started_at=1000.0, stopped_at=1000.0 + 3600, cost_usd=None, estimate=False, note=None)


def test_a_live_frozen_price_is_no_estimate_in_the_cost() -> None:
    live = price_fields(live_price(2.0, "azure retail prices", "eastus"))
    got = cloud_interval_cost(_interval("on-demand", 2.0), minimum_s=60, spot=None, disk_gb=0,
                              disk_usd_per_gb_month=0, disk_label="disk", frozen=live)
    assert got.cost_usd == 2.0 and not got.estimate and "live (azure retail prices, eastus" in (got.note or "")
    est = price_fields(catalog_price(2.0, "2025-12"))
    got = cloud_interval_cost(_interval("on-demand", 2.0), minimum_s=60, spot=None, disk_gb=0,
                              disk_usd_per_gb_month=0, disk_label="disk", frozen=est)
    assert got.estimate and "estimate (catalog 2025-12)" in (got.note or "")
    old = cloud_interval_cost(_interval("on-demand", 2.0), minimum_s=60, spot=None, disk_gb=0,
                              disk_usd_per_gb_month=0, disk_label="disk")  # a record from before: as it was
    assert old.estimate and "from the gtrain catalog" in (old.note or "")


# ---- the node's budget watch ------------------------------------------------------------------------------

def test_budget_bills_each_interval_at_the_price_then_and_stops_one_interval_early() -> None:
    w = nodebudget.Budget(budget_usd=1.0, usd_per_hour=1.0, source="frozen", interval_s=60, now=0.0)
    assert not w.check(1800.0, 1.0, "live")  # $0.50 spent, +$0.0167 next: go on
    assert w.spent_usd == pytest.approx(0.5)
    assert not w.check(1860.0, None, None)  # no price read: the last one holds
    assert w.usd_per_hour == 1.0 and w.source == "live"
    # the price jumps to $30/h: $0.5167 spent + one more minute at $30/h ($0.50) passes $1: stop now
    assert w.check(1920.0, 30.0, "live 2")
    assert w.spent_usd == pytest.approx(0.5 + 2 / 60) and w.spent_usd < w.budget_usd
    restarted = nodebudget.Budget(1.0, 1.0, "frozen", 60, state=w.to_dict())  # goes on from what was spent
    assert restarted.spent_usd == pytest.approx(w.spent_usd) and restarted.usd_per_hour == 30.0


def test_sigv4_signs_as_botocore_does() -> None:
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url, body = "https://ec2.us-east-1.amazonaws.com/", b"Action=DescribeSpotPriceHistory&Version=2016-11-15"
    creds = ("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "session-token")
    req = AWSRequest(method="POST", url=url, data=body,
                     headers={"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
    SigV4Auth(Credentials(*creds), "ec2", "us-east-1").add_auth(req)  # botocore signs at its own clock
    now = dt.datetime.strptime(str(req.headers["X-Amz-Date"]), "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    mine = nodebudget.sigv4_headers("POST", url, body, "us-east-1", "ec2", creds, now)
    assert mine["Authorization"] == str(req.headers["Authorization"])
    assert mine["X-Amz-Security-Token"] == "session-token"
    assert creds[1] not in repr(mine)  # the secret signs; it is never sent


def test_nodebudget_refuses_a_call_without_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert nodebudget.main(["--budget-usd", "1", "--price", "1", "--state", "/tmp/x"]) == 2
    assert "usage" in capsys.readouterr().err


def test_a_price_written_to_the_node_is_used(tmp_path: Any) -> None:
    """No instance role: the watch takes a price written to its price file, and stops on it."""
    import json
    import subprocess
    import sys

    (tmp_path / "price.json").write_text(json.dumps({"usd_per_hour": 1000.0, "source": "written"}))
    stop = tmp_path / "stopped"
    r = subprocess.run([sys.executable, nodebudget.__file__, "--budget-usd", "0.01", "--price", "0.5",
                        "--interval", "0.2", "--state", str(tmp_path / "b.json"), "--price-file",
                        str(tmp_path / "price.json"), "--", sys.executable, "-c",
                        f"open({str(stop)!r}, 'w').write('x')"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and stop.exists(), r.stdout + r.stderr
    state = json.loads((tmp_path / "b.json").read_text())
    assert state["stopped"] and state["source"] == "written" and state["usd_per_hour"] == 1000.0
