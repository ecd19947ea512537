"""`gtrain start` on a cloud whose nodes schedule their time limit at first boot only (EC2 user data): what is
left of each node's lifetime counts the time it ran, not the time it was stopped; a node with under a minute
left is not started (it would end itself at once)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from gtrain.providers.cloud.lifetime import BudgetSpent, time_left_s


def _provider(intervals: list[tuple[int, str, float, float | None]]) -> SimpleNamespace:
    rows = [SimpleNamespace(node_rank=r, market=m, started_at=a, stopped_at=b) for r, m, a, b in intervals]
    return SimpleNamespace(store=SimpleNamespace(intervals=lambda _cid: rows))


def _cluster(**policies: float) -> SimpleNamespace:
    return SimpleNamespace(id="c1", name="c", num_nodes=2, price_per_hour=2.0, spec={"policies": policies})


def test_the_stopped_time_does_not_count_and_each_node_has_its_own() -> None:
    now = time.time()
    p = _provider([(0, "on-demand", now - 5000, now - 4000),  # ran 1000 s, then stopped for a long while
                   (0, "stopped", now - 4000, now),
                   (1, "on-demand", now - 5000, now - 3000),  # ran 2000 s
                   (1, "stopped", now - 3000, now)])
    left = time_left_s(p, _cluster(max_hours=1), [0, 1])  # type: ignore[arg-type]
    assert left[0] == pytest.approx(2600, abs=2) and left[1] == pytest.approx(1600, abs=2)
    # a cost cap is a time cap: $3 over 2 nodes at $2/h each = 45 min
    assert time_left_s(p, _cluster(max_cost_usd=3), [0])[0] == pytest.approx(2700 - 1000, abs=2)  # type: ignore[arg-type]
    assert time_left_s(p, _cluster(), [0, 1]) == {}  # type: ignore[arg-type]  # no limit: nothing to re-arm


def test_a_node_whose_time_is_spent_is_not_started() -> None:
    now = time.time()
    p = _provider([(0, "on-demand", now - 3590, now - 10), (0, "stopped", now - 10, None)])
    with pytest.raises(BudgetSpent) as e:
        time_left_s(p, _cluster(max_hours=1), [0])  # type: ignore[arg-type]
    assert "nothing was started" in e.value.message and "node(s) [0]" in e.value.message
