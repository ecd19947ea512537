"""Where a spec with ``resources.any_of`` lands (docs/any_of.md).

Every candidate is resolved into a plain spec (:func:`gtrain.spec.anyof.candidate_specs`), planned and priced by
its own provider (offline: ``Provider.plan`` touches nothing), and ordered: by the cluster's $/h (``order:
price``, the default; ties keep the listed order) or as listed. ``up`` tries them in that order on one cluster
record: a candidate whose quota cannot hold the request (``Provider.quota_check``) is skipped before anything is
made; a ``CapacityError`` or ``QuotaError`` from ``provision`` (which leaves nothing behind: the providers' own
contract) moves on to the next. What was tried, and why each was passed over, is kept in the cluster's ``extra``
(``any_of``), which ``status``, ``cost`` and the report's timeline read. Nothing here names a provider.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from gtrain.errors import CapacityError, ConfigError, GtrainError, QuotaError

if TYPE_CHECKING:
    from gtrain.context import Context
    from gtrain.providers.base import Plan
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster


@dataclass
class Offer:
    """One candidate: its plain spec, its plan (None when its provider cannot plan it) and what became of it."""

    index: int
    label: str
    spec: ClusterSpec
    plan: Plan | None = None
    #: ``cannot plan``, ``untried``, ``chosen`` (dry run), ``skipped`` (quota pre-check), ``no capacity``,
    #: ``no quota``, ``landed``
    outcome: str = "untried"
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        p = self.plan
        return {"candidate": self.index + 1, "label": self.label, "provider": self.spec.provider,
                "region": p.region if p else None, "zone": p.zone if p else None,
                "instance_type": p.instance_type if p else None, "market": p.market if p else None,
                "cluster_price_per_hour": round(p.cluster_price_per_hour, 4) if p else None,
                "outcome": self.outcome, "why": self.why}


def offers(spec: ClusterSpec, ctx: Context) -> list[Offer]:
    """Every candidate planned and priced, in the order ``up`` tries them (unplannable ones last)."""
    out = []
    for i, (cand, cspec) in enumerate(zip(spec.resources.any_of or [], candidate_specs(spec), strict=True)):
        o = Offer(i, cand.label(i), cspec)
        try:
            o.plan = ctx.provider(cspec.provider).plan(cspec)
        except GtrainError as e:
            o.outcome, o.why = "cannot plan", _first_line(e.message)
        out.append(o)
    if order_of(spec) == "price":
        out.sort(key=lambda o: (o.plan is None, o.plan.cluster_price_per_hour if o.plan else 0.0, o.index))
    else:
        out.sort(key=lambda o: (o.plan is None, o.index))
    return out


def candidate_specs(spec: ClusterSpec) -> list[ClusterSpec]:
    """One plain spec per candidate, in the order listed (no ``any_of`` left in them)."""
    from gtrain.spec import parse_spec
    from gtrain.spec.anyof import candidate_providers

    out = []
    base = spec.to_yaml_dict()
    for i, c in enumerate(spec.resources.any_of or []):
        data = {k: v for k, v in base.items() if k not in candidate_providers(spec) or k == c.provider}
        res = {k: v for k, v in (base.get("resources") or {}).items() if k not in ("any_of", "order")}
        given = c.model_dump(exclude_none=True, exclude={"provider"})
        if "region" in given or "regions" in given:
            res.pop("region", None)
            res.pop("regions", None)
        res.update(given)
        data.update(provider=c.provider, resources=res)
        out.append(parse_spec(data, base_dir=spec.base_dir, source=f"resources.any_of[{i}]"))
    return out


def order_of(spec: ClusterSpec) -> str:
    return spec.resources.order or "price"


def why_first(spec: ClusterSpec, first: Offer, plannable: list[Offer]) -> str:
    if order_of(spec) == "listed":
        return "first plannable candidate as listed (order: listed)"
    if len(plannable) == 1:
        return "the only candidate that can be planned"
    return f"cheapest of {len(plannable)} priced candidates (order: price)"


def record(spec: ClusterSpec, all_offers: list[Offer]) -> dict[str, Any]:
    """What the cluster keeps in ``extra['any_of']``: the spec as written and every candidate's fate."""
    return {"order": order_of(spec), "spec": spec.to_yaml_dict(),
            "candidates": [o.to_dict() for o in all_offers]}


def _first_line(msg: str) -> str:
    return msg.strip().splitlines()[0] if msg.strip() else msg


def store_warnings(spec: ClusterSpec, all_offers: list[Offer]) -> list[str]:
    """The checkpoint store must be reachable from every candidate, so a move can resume from it."""
    providers = sorted({o.spec.provider for o in all_offers if o.plan is not None})
    if len(providers) < 2 or spec.job is None:
        return []
    store = spec.job.checkpoint_store
    if store is None:
        return [f"resources.any_of spans {', '.join(providers)} but job.checkpoint_store is not set: a run moved to "
                "another candidate starts from scratch; set a bucket every candidate's nodes can read and write"]
    return [f"resources.any_of spans {', '.join(providers)}: job.checkpoint_store {store} must be readable and "
            "writable from each of them (its credentials reach every candidate's nodes), or a move resumes "
            "from nothing"]


def quota_skip(ctx: Context, o: Offer) -> str | None:
    """The candidate's provider's quota pre-check (optional: None when it has none or cannot tell)."""
    assert o.plan is not None
    try:
        return ctx.provider(o.spec.provider).quota_check(o.spec, o.plan)
    except GtrainError as e:  # a quota we cannot read is no reason to skip: provision will tell
        ctx.report.warn(f"{o.label}: could not read its quota ({_first_line(e.message)}); trying it anyway")
        return None


def prepare(spec: ClusterSpec, ctx: Context) -> tuple[list[Offer], list[Offer]]:
    """Every candidate priced (in the order tried) and those that can be planned; exit 2 when none can."""
    all_offers = offers(spec, ctx)
    plannable = [o for o in all_offers if o.plan is not None]
    if not plannable:
        raise ConfigError("resources.any_of: no candidate can be planned:\n" +
                          "\n".join(f"  - {o.label}: {o.why}" for o in all_offers), field="resources.any_of",
                          hint="fix the candidates (accelerators, regions) or add one that offers the request")
    for w in store_warnings(spec, all_offers):
        ctx.report.warn(w)
    return all_offers, plannable


def choose(spec: ClusterSpec, plannable: list[Offer]) -> Offer:
    """What a dry run shows as chosen: the first candidate ``up`` would try, and why."""
    plannable[0].outcome, plannable[0].why = "chosen", why_first(spec, plannable[0], plannable)
    return plannable[0]


class Landed(Protocol):
    """What an attempt returns (gtrain.runs.cluster.UpResult)."""

    cluster: Cluster | None
    placement: dict[str, Any] | None


R = TypeVar("R", bound=Landed)


def try_in_order(spec: ClusterSpec, ctx: Context, all_offers: list[Offer], plannable: list[Offer],
                 cluster: Cluster | None, provision: Callable[[Offer, Cluster | None, dict[str, Any]], R]) -> R:
    """Under the cluster's lock: each plannable candidate in turn until one lands (see the module's doc);
    ``provision(offer, cluster record or None, extra)`` makes the offer's nodes (gtrain.runs.cluster.provision)."""
    if cluster is not None:  # an interrupted up (kept with --keep-failed): resume where it was
        was = cluster.spec
        plannable.sort(key=lambda o: o.spec.to_yaml_dict() != was)
    for o in plannable:
        assert o.plan is not None
        why = quota_skip(ctx, o)
        if why:
            o.outcome, o.why = "skipped", why
            ctx.report.warn(f"{o.label}: skipped before anything was made: {why}")
            continue
        ctx.report.info(f"trying {o.label}: {o.plan.instance_type or '-'} {o.plan.market} in "
                        f"{o.plan.region or '-'} at ${o.plan.cluster_price_per_hour:.2f}/h")
        o.outcome = "landed"
        try:
            res = provision(o, cluster, {"any_of": record(spec, all_offers)})
        except (CapacityError, QuotaError) as e:
            o.outcome = "no quota" if isinstance(e, QuotaError) else "no capacity"
            o.why = _first_line(e.message) + (f" ({len(e.attempts)} place(s) tried)"
                                               if isinstance(e, CapacityError) and e.attempts else "")
            ctx.report.warn(f"{o.label}: {o.outcome}; trying the next candidate")
            # the record the failed candidate left terminated (nothing made) is taken over by the next, so a
            # spec keeps one cluster id whichever candidate it lands on
            cluster = ctx.store.find_cluster(spec.name)
            if cluster is not None and cluster.status != "terminated":
                raise  # something of it was kept (--keep-failed): not ours to replace
            continue
        assert res.cluster is not None
        ctx.store.update_cluster(res.cluster.id, extra={**res.cluster.extra, "any_of": record(spec, all_offers)})
        passed = [f"{x.label}: {x.outcome}" for x in all_offers if x.outcome not in ("landed", "untried")]
        ctx.event(res.cluster, "placement", msg=f"landed on {o.label}" + (
            f" (passed over: {'; '.join(passed)})" if passed else ""), provider=o.spec.provider)
        res.placement = record(spec, all_offers)
        res.cluster = ctx.store.get_cluster_by_id(res.cluster.id)
        return res
    raise CapacityError("no candidate of resources.any_of could be had",
                        [f"{o.label}: {o.outcome}: {o.why}" for o in all_offers],
                        hint="add candidates (other regions or clouds), or try again later")
