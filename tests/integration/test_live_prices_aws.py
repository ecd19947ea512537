"""aws: the live spot price at ``up`` (describe_spot_price_history for the chosen zone, latest), the catalog as
the fallback (history missing, implausible, API refusing), and the node's own cost cap re-pricing spot: a
node whose spot price rose past what is left of its budget stops itself within its check interval.

moto's own spot price history is one constant, so the prices come from tests/fixtures/fake_aws_spot.py, an
EC2 Query API fake of DescribeSpotPriceHistory in front of the session's moto server (every other call goes
to moto)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gtrain.providers.aws.nodebudget as nodebudget
from tests.fixtures.fake_aws_spot import FakeSpot, serve

pytestmark = pytest.mark.usefixtures("moto_server")

ZONE, ITYPE = "us-east-1a", "p3.2xlarge"  # the node watch tests; the up tests price the plan's type


@pytest.fixture(scope="module")
def spot(moto_server: str) -> Iterator[FakeSpot]:
    with serve(moto_server) as fake:
        yield fake


def _watch(tmp: Path, endpoint: str, budget: float, price: float, interval: float,
           env: dict[str, str] | None = None, zone: str = ZONE) -> subprocess.Popen[str]:
    stop = tmp / "stopped"
    cmd = [sys.executable, nodebudget.__file__, "--budget-usd", str(budget), "--price", str(price),
           "--source", "live (aws spot price history, frozen at up)", "--interval", str(interval),
           "--state", str(tmp / "budget.json"), "--aws-region", "us-east-1", "--aws-zone", zone,
           "--instance-type", ITYPE, "--ec2-endpoint", endpoint, "--",
           sys.executable, "-c", f"import time; open({str(stop)!r}, 'w').write(repr(time.time()))"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})


def test_node_stops_itself_when_the_spot_price_rises_past_its_budget(spot: FakeSpot, tmp_path: Path) -> None:
    interval = 0.5
    spot.set_price(ZONE, ITYPE, 0.40, at=time.time() - 3600)
    asked = len(spot.requests)
    # $0.02 at $0.40/h lasts 3 minutes: the node keeps running while the price holds
    proc = _watch(tmp_path, spot.url, budget=0.02, price=0.40, interval=interval)
    try:
        deadline = time.time() + 20
        while not (tmp_path / "budget.json").exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)  # the watch's first check (a loaded machine starts python slowly)
        time.sleep(3 * interval)
        assert proc.poll() is None, proc.communicate()[0]
        state = json.loads((tmp_path / "budget.json").read_text())
        assert state["usd_per_hour"] == pytest.approx(0.40) and not state["stopped"]
        assert state["source"].startswith("aws spot price history, us-east-1a, ")
        # the price jumps: what is left (~$0.0198) lasts 0.14 s at $500/h, less than one check interval
        changed = time.time()
        spot.set_price(ZONE, ITYPE, 500.0, at=changed)
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    stopped_at = float((tmp_path / "stopped").read_text())
    # the first check after the change: within one interval (+ slack for a loaded CI machine), where the old
    # price would have run three minutes more
    assert stopped_at - changed <= interval + 2.0, out
    state = json.loads((tmp_path / "budget.json").read_text())
    assert state["stopped"] and state["usd_per_hour"] == pytest.approx(500.0)
    assert state["spent_usd"] <= 0.02, state  # stopped before the next interval would have spent past the cap
    assert "budget reached" in out and "price now $500/h" in out
    # the node asked EC2 itself, signed, for its own type and zone, the price in effect now
    mine = spot.requests[asked:]
    assert mine and all(r["InstanceType.1"] == [ITYPE] and r["AvailabilityZone"] == [ZONE]
                        and r["ProductDescription.1"] == ["Linux/UNIX"] for r in mine)


def test_the_boot_script_starts_the_watch_that_stops_the_node(spot: FakeSpot, tmp_path: Path) -> None:
    """What an aws spot node runs at boot (the user data of budget_watch_user_data), run here as bash: the watch
    starts detached, re-prices, and stops the node when the price rises past what is left."""
    from gtrain.providers.aws.instances import shutdown_user_data
    from gtrain.providers.aws.pricing import budget_watch_user_data
    from gtrain.providers.cloud.billing import live_price

    zone = "us-east-1c"
    spot.set_price(zone, ITYPE, 0.40, at=time.time() - 60)
    stop = tmp_path / "stopped"
    frozen = live_price(0.40, "aws spot price history", zone, time.time() - 60)
    real = shutdown_user_data(3600) + budget_watch_user_data(0.05, 0.4, frozen.label, "us-east-1", zone, ITYPE)
    assert len(real.encode()) < 16 * 1024  # EC2's limit on user data
    script = "#!/bin/bash\n" + budget_watch_user_data(
        0.05, 0.4, frozen.label, "us-east-1", zone, ITYPE, 0.3, root=str(tmp_path / "opt"), endpoint=spot.url,
        command=(sys.executable, "-c", f"open({str(stop)!r}, 'w').write('x')"))
    subprocess.run(["bash", "-c", script], check=True, timeout=30,
                   env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    try:
        deadline = time.time() + 20
        while not (tmp_path / "opt" / "budget.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        assert json.loads((tmp_path / "opt" / "budget.json").read_text())["source"].startswith("aws spot price")
        assert not stop.exists()
    finally:
        spot.set_price(zone, ITYPE, 900.0)  # and the detached watch ends itself, whatever happened above
    while not stop.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert stop.exists(), (tmp_path / "opt" / "budget.log").read_text()
    assert "budget reached" in (tmp_path / "opt" / "budget.log").read_text()


def test_node_keeps_its_last_price_when_the_api_refuses(spot: FakeSpot, tmp_path: Path) -> None:
    """Throttled (503 RequestLimitExceeded), then no credentials at all: the node goes on at the price it has and
    says why once; it does not stop for a price it could not read."""
    spot.throttle = 2
    asked = len(spot.requests)
    proc = _watch(tmp_path, spot.url, budget=5.0, price=0.40, interval=0.2, zone="us-east-1b")
    try:
        deadline = time.time() + 20
        while (spot.throttle or len(spot.requests) < asked + 3) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)  # both refusals answered, and a read after them
    finally:
        proc.kill()
        spot.throttle = 0
    out = proc.communicate()[0]
    assert "spot price not read (HTTPError: HTTP Error 503" in out, out
    state = json.loads((tmp_path / "budget.json").read_text())
    assert state["usd_per_hour"] == pytest.approx(0.40) and not state["stopped"]


def test_the_fake_refuses_what_ec2_refuses(spot: FakeSpot) -> None:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=spot.url)
    with pytest.raises(ClientError, match="InvalidParameterValue"):
        ec2.describe_spot_price_history(ProductDescriptions=["Plan9"])
    with pytest.raises(ClientError, match="maxResults"):
        ec2.describe_spot_price_history(MaxResults=2)
    spot.throttle = 1
    with pytest.raises(ClientError, match="RequestLimitExceeded"):
        boto3.client("ec2", region_name="us-east-1", endpoint_url=spot.url,
                     config=Config(retries={"total_max_attempts": 1})
                     ).describe_spot_price_history(InstanceTypes=[ITYPE])
    status, body = spot.answer({"Action": ["DescribeSpotPriceHistory"]}, {})
    assert status == 401 and "AuthFailure" in body
    status, body = spot.answer({"Action": ["DescribeSpotPriceHistory"], "Bogus": ["1"]},
                               {"Authorization": "AWS4-HMAC-SHA256 Credential=x"})
    assert status == 400 and "UnknownParameter" in body
    # every other call reaches moto behind it
    assert ec2.describe_availability_zones()["AvailabilityZones"]


# ---- the price `up` freezes --------------------------------------------------------------------------------

def _spec(name: str, spot: bool) -> Any:
    from gtrain.spec import parse_spec

    return parse_spec({"name": name, "provider": "aws", "num_nodes": 1,
                       "resources": {"accelerators": "A10G:1", "region": "us-east-1", "disk_gb": 100,
                                     "use_spot": spot},
                       "policies": {"max_hours": 2, "max_cost_usd": 5},
                       "aws": {"ssh_cidr": "198.51.100.7/32", "wait_ssh": False, "poll_s": 0.2}})


def _ctx() -> Any:
    from gtrain.context import Context
    from gtrain.providers.aws import AWSProvider
    from gtrain.state import StateStore

    ctx = Context(store=StateStore())
    ctx._providers["aws"] = AWSProvider(ctx.store, ctx.report)
    return ctx


def test_up_freezes_the_live_spot_price_of_its_zone(spot: FakeSpot, monkeypatch: pytest.MonkeyPatch) -> None:
    from gtrain.costs.report import cluster_cost
    from gtrain.providers.cloud.lifetime import cluster_lifetime_s
    from gtrain.runs import cluster as core

    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", spot.url)
    ctx, s = _ctx(), _spec("live-spot", spot=True)
    itype = ctx.provider("aws").plan(s).instance_type
    at = time.time() - 600
    for z in "abcdef":  # whichever zone the node lands in has a live price
        spot.set_price(f"us-east-1{z}", itype, 0.3712, at=at)
    res = core.up(s, ctx)
    try:
        c = res.cluster
        assert c is not None and res.plan.price_per_hour == pytest.approx(0.3712)
        assert c.price_per_hour == pytest.approx(0.3712) and c.extra["price_live"] is True
        assert c.extra["price_source"].startswith("live (aws spot price history, us-east-1")
        assert c.extra["price_source"].endswith(time.strftime("%Y-%m-%dT%H:%MZ)", time.gmtime(at)))
        assert any(n.startswith("price: $0.3712/h per node, live (") for n in res.plan.notes)
        assert [i.price_per_hour for i in ctx.store.intervals(c.id)] == [pytest.approx(0.3712)]
        # the cap uses it: $5 at $0.3712/h is 13.5 h, beyond max_hours' 2 h
        assert cluster_lifetime_s(c) == 2 * 3600
        report = cluster_cost(ctx.store, c, ctx.provider("aws"))
        assert report.price_source == c.extra["price_source"] and not report.lines[0].estimate
        # the node was launched with its own budget watch at that price (its boot script, after the lifetime's)
        import base64

        import boto3

        [node] = ctx.store.nodes(c.id)
        got = boto3.client("ec2", region_name="us-east-1").describe_instance_attribute(
            InstanceId=str(node.instance_id), Attribute="userData")["UserData"]["Value"]
        boot = base64.b64decode(got).decode()
        assert "held by the node at its live spot price" in boot and "--price 0.3712" in boot, boot[-600:]
    finally:
        core.down(s.name, ctx)


def test_up_falls_back_to_the_catalog_estimate_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto's own history ($0.00001/h, 2006) is implausible; on-demand reads no live list: both the catalog."""
    from gtrain.catalog import snapshot_date
    from gtrain.runs import cluster as core

    for spot_market in (True, False):
        ctx, s = _ctx(), _spec(f"est-{int(spot_market)}", spot=spot_market)
        res = core.up(s, ctx)
        try:
            c = res.cluster
            assert c is not None and c.extra["price_live"] is False
            assert c.extra["price_source"] == f"estimate (catalog {snapshot_date('aws')})"
            note = next(n for n in res.plan.notes if n.startswith("price: "))
            assert ("implausible" if spot_market else "Price List Query API") in note, note
            assert c.price_per_hour == res.plan.price_per_hour > 0.1
        finally:
            core.down(s.name, ctx)


def test_a_nodes_budget_is_what_is_left_of_its_share() -> None:
    from types import SimpleNamespace

    from gtrain.providers.aws.pricing import node_budget_usd
    from gtrain.spec import Policies

    now = time.time()
    fresh = SimpleNamespace(created_at=now, name="c")
    p = Policies(max_cost_usd=10, max_hours=1)  # max_hours binds the lifetime; the budget is the cost share
    assert node_budget_usd(p, 2, 0.5, fresh) == pytest.approx(5.0, rel=1e-3)
    late = SimpleNamespace(created_at=now - 5 * 3600, name="c")  # a replacement 5 h into a 10 h slot
    assert node_budget_usd(p, 2, 0.5, late) == pytest.approx(2.5, rel=1e-3)
    assert node_budget_usd(Policies(max_hours=1), 2, 0.5, fresh) is None
