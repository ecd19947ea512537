"""The failover bookkeeping of ``up``: each failed zone/region attempt, then one Capacity- or QuotaError that
lists them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NoReturn

from gtrain.errors import CapacityError, GtrainError, QuotaError


@dataclass
class Attempts:
    """Where ``up`` tried and why it failed there; :meth:`fail` raises the one error that lists them."""

    items: list[str] = field(default_factory=list)
    all_quota: bool = True

    def add(self, where: str, err: GtrainError | str) -> None:
        if isinstance(err, GtrainError):
            self.all_quota &= isinstance(err, QuotaError)
            self.items.append(f"{where}: {err.message}")
        else:
            self.items.append(f"{where}: {err}")

    def fail(self, what: str, *, quota_hint: str, capacity_hint: str) -> NoReturn:
        if self.items and self.all_quota:
            raise QuotaError(f"no quota for {what} in any region tried:\n" + "\n".join(f"  - {a}" for a in self.items),
                             hint=quota_hint)
        raise CapacityError(f"no capacity for {what} in any zone or region tried", self.items, hint=capacity_hint)
