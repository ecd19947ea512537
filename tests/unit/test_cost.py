from __future__ import annotations

from gtrain.costs.report import cluster_cost
from gtrain.providers.base import IntervalCost, NodeStatus, Plan, Provider
from gtrain.spec import ClusterSpec
from gtrain.state import Cluster, CostInterval, StateStore


class PerSecond(Provider):
    """A provider with EC2-like billing, to test the shared cost machinery (not a fake of a cloud)."""

    name = "persecond"
    billing_minimum_s = 60.0

    def plan(self, spec: ClusterSpec) -> Plan:
        return Plan("persecond", spec.num_nodes, "t", "on-demand", price_per_hour=3.6)

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None: ...

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        return []

    def terminate(self, cluster: Cluster) -> None: ...

    def runners(self, cluster: Cluster) -> list:  # type: ignore[type-arg]
        return []

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        cost = self.billed_cost(interval, now=interval.stopped_at or 0)
        return IntervalCost(cost, estimate=interval.market == "spot")


def test_abc_refuses_a_provider_missing_a_method() -> None:
    import pytest

    class Half(Provider):
        name = "half"

        def plan(self, spec: ClusterSpec) -> Plan:
            raise NotImplementedError

    with pytest.raises(TypeError, match="abstract"):
        Half(StateStore())  # type: ignore[abstract]


def test_billing_minimum_per_second_and_report_totals() -> None:
    s = StateStore()
    p = PerSecond(s)
    c = s.create_cluster(name="c", provider="local", num_nodes=2, spec={}, price_per_hour=3.6)
    s.open_interval(c.id, 0, instance_type="t", market="on-demand", price_per_hour=3.6, started_at=1000.0)
    s.open_interval(c.id, 1, instance_type="t", market="spot", price_per_hour=3.6, started_at=1000.0)
    s.close_intervals(c.id, at=1010.0)  # 10 s, billed as 60 s
    rep = cluster_cost(s, s.get_cluster_by_id(c.id), p, persist=True)
    assert [round(ln.cost_usd, 6) for ln in rep.lines] == [0.06, 0.06]
    assert rep.total_usd == 0.12 and rep.estimate is True
    assert abs(rep.node_hours - 20 / 3600) < 1e-6
    # persisted: the price of a finished run never changes afterwards
    assert [iv.cost_usd for iv in s.intervals(c.id)] == [0.06, 0.06]
    s.update_cluster(c.id, price_per_hour=99.0)
    again = cluster_cost(s, s.get_cluster_by_id(c.id), p)
    assert again.total_usd == 0.12


def test_lifetime_from_time_and_cost_caps() -> None:
    from types import SimpleNamespace

    from gtrain.providers.cloud.lifetime import lifetime_s

    def pol(h: float | None = None, usd: float | None = None) -> SimpleNamespace:
        return SimpleNamespace(max_hours=h, max_cost_usd=usd)

    assert lifetime_s(pol(), 4, 2.0) is None
    assert lifetime_s(pol(h=1.5), 4, 2.0) == 5400
    assert lifetime_s(pol(usd=10), 4, 2.0) == int(10 / 8 * 3600)  # $10 over 4 nodes at $2/h: 1.25 h
    assert lifetime_s(pol(h=1, usd=10), 4, 2.0) == 3600  # the tighter cap
    assert lifetime_s(pol(usd=0.001), 1, 100.0) == 60  # never less than a minute
    assert lifetime_s(pol(usd=5), 2, None) is None  # no price known: a cost cap cannot become a time cap
