"""``resources.any_of`` / ``resources.order``: one spec, several candidate placements (docs/any_of.md).

A candidate names a provider and may override where and what: ``region`` / ``regions`` / ``zones`` /
``use_spot`` / ``accelerators`` / ``instance_type``. ``gtrain.runs.placement.candidate_specs`` turns a spec with
``any_of`` into one plain :class:`~gtrain.spec.ClusterSpec` per candidate (one provider, the candidate's
overrides applied, only that provider's section kept), so every provider reads its candidate through the usual
seam and nothing here names one. Pydantic only: ``gtrain.spec`` imports this module.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gtrain.errors import ConfigError

ACCEL_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_-]*)(?::(\d+))?$")
MAX_CANDIDATES = 32
#: the fields of ``resources`` a candidate may set for itself
OVERRIDES = ("region", "regions", "zones", "use_spot", "accelerators", "instance_type")
Order = Literal["price", "listed"]


def provider_known(name: str) -> bool:
    """A name a spec may give as ``provider:`` (and as a section): registered, or planned (refused at `up`)."""
    from gtrain.registry import PLANNED, REGISTRY, provider_names

    return name in REGISTRY or name in PLANNED or name in provider_names()


def _provider_choices() -> list[str]:
    from gtrain.registry import PLANNED, provider_names

    return sorted({*provider_names(), *PLANNED})


def check_accelerators(v: str | None) -> str | None:
    """``GPU:COUNT`` (COUNT 1..16, default 1), a lower-case name upper-cased."""
    if v is None:
        return v
    from gtrain.registry import accelerator_family, accelerator_shape

    if accelerator_family(v):  # a Cloud TPU slice, `tpu-v5p-32`: its provider's type (docs/providers/tpu.md)
        return accelerator_shape(v).name
    m = ACCEL_RE.match(v)
    if not m:
        raise ValueError("must look like GPU:COUNT, e.g. A100:8 or H100:1")
    count = int(m.group(2) or 1)
    if not 1 <= count <= 16:
        raise ValueError("GPU count must be between 1 and 16 per node")
    return f"{m.group(1).upper() if m.group(1).islower() else m.group(1)}:{count}"


class Candidate(BaseModel):
    """One entry of ``resources.any_of``."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    provider: str | None = Field(None, description="the candidate's provider; default: the spec's `provider:`")
    region: str | None = Field(None, description="one region (replaces `resources.region`/`regions`)")
    regions: list[str] | None = Field(None, description="regions to try, in order")
    zones: list[str] | None = Field(None, description="zones to try")
    use_spot: bool | None = Field(None, description="spot / preemptible capacity for this candidate")
    accelerators: str | None = Field(None, description="`GPU:COUNT` for this candidate")
    instance_type: str | None = Field(None, description="the provider's machine type for this candidate")

    @field_validator("provider")
    @classmethod
    def _provider(cls, v: str | None) -> str | None:
        if v is not None and not provider_known(v):
            choices = _provider_choices()
            expected = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
            raise PydanticCustomError("literal_error", "not a provider", {"expected": expected})
        return v

    @field_validator("accelerators")
    @classmethod
    def _accel(cls, v: str | None) -> str | None:
        return check_accelerators(v)

    @model_validator(mode="after")
    def _where(self) -> Candidate:
        if self.region is not None and self.regions:
            raise ValueError("give `region` or `regions`, not both")
        if self.regions is not None and not self.regions:
            raise ValueError("regions: an empty list; give at least one region or leave it out")
        return self

    def label(self, index: int) -> str:
        where = self.region or (",".join(self.regions) if self.regions else "")
        return f"#{index + 1} {self.provider}" + (f" ({where})" if where else "")


def check_candidates(v: list[Candidate] | None) -> list[Candidate] | None:
    if v is None:
        return v
    if not v:
        raise ValueError("an empty list; give at least one candidate ({provider: NAME}) or leave any_of out")
    if len(v) > MAX_CANDIDATES:
        raise ValueError(f"{len(v)} candidates; at most {MAX_CANDIDATES}")
    return v


def settle(spec: Any, provider_given: bool) -> None:
    """Give each candidate its provider and check the spec's `provider:` and sections agree with them.

    Rules: a candidate without ``provider`` takes the spec's ``provider:`` (which must then be given); a spec's
    ``provider:`` given next to candidates of other providers is refused (omit it, or name it in every
    candidate); a section (``aws:``) is allowed for every candidate's provider and for none other. A TPU
    slice's ``num_nodes`` is its host count (:func:`settle_nodes`)."""
    given = "num_nodes" in spec.model_fields_set
    cands = spec.resources.any_of or []
    settle_nodes(spec, "resources.accelerators", spec.resources.accelerators, given)
    for i, c in enumerate(cands):
        settle_nodes(spec, f"resources.any_of[{i}].accelerators", c.accelerators, given, candidate=True)
    if spec.resources.order is not None and not cands:
        raise ValueError("resources.order is given without resources.any_of; add candidates or drop `order`")
    if not cands:
        check_served(spec, "resources.accelerators", spec.resources.accelerators, spec.provider)
        return
    for i, c in enumerate(cands):
        if c.provider is None:
            if not provider_given:
                raise ValueError(f"resources.any_of[{i}].provider: required field is missing (give each candidate "
                                 "a provider, or a top-level `provider:` they share)")
            c.provider = spec.provider
        elif provider_given and c.provider != spec.provider:
            raise ValueError(f"resources.any_of[{i}].provider: {c.provider!r} disagrees with provider "
                             f"{spec.provider!r}; omit the top-level `provider:` when candidates name several")
    for i, c in enumerate(cands):
        field = f"resources.any_of[{i}].accelerators" if c.accelerators else "resources.accelerators"
        check_served(spec, field, c.accelerators or spec.resources.accelerators, c.provider or spec.provider,
                     f" (candidate #{i + 1})")


def check_served(spec: Any, field: str, accelerators: str | None, provider: str, where: str = "") -> None:
    """An accelerator family's type only on the provider that makes it (a TPU slice: gcp), and no more ranks on
    a host than it has chips."""
    from gtrain.registry import accelerator_family, accelerator_shape

    if not accelerator_family(accelerators):
        return
    shape = accelerator_shape(accelerators or "")
    if provider != shape.provider:
        raise ConfigError(f"invalid spec: {field}: {shape.name} is a {shape.family.upper()} type only provider "
                          f"{shape.provider!r} serves, but the provider is {provider!r}{where}", field=field,
                          hint=f"set provider: {shape.provider}, or name GPUs (GPU:COUNT)")
    nproc = spec.job.nproc_per_node if spec.job is not None else None
    if nproc is not None and nproc > shape.chips_per_node:
        raise ConfigError(f"invalid spec: job.nproc_per_node: {nproc} processes on a host of {shape.name}, which "
                          f"has {shape.chips_per_node} chip(s) per host", field="job.nproc_per_node",
                          hint=f"give at most {shape.chips_per_node}, or leave it out (one per chip)")


def settle_nodes(spec: Any, field: str, accelerators: str | None, given: bool, candidate: bool = False) -> None:
    """A slice's worker hosts are its nodes (an accelerator family's shape, read through the registry): taken
    from the type when ``num_nodes`` is not given (a candidate's plain spec takes them in
    ``placement.candidate_specs``), refused (a ValueError naming the fields) when the given one differs."""
    from gtrain.registry import accelerator_family, accelerator_shape

    if not accelerator_family(accelerators):
        return
    hosts = accelerator_shape(accelerators or "").nodes
    if given and spec.num_nodes != hosts:
        raise ValueError(f"num_nodes: {spec.num_nodes} does not match {field} {accelerators}, a slice of {hosts} "
                         f"worker host(s); drop num_nodes or set it to {hosts}"
                         + (" (a slice candidate takes its host count when num_nodes is not given)"
                            if candidate else ""))
    if not given and not candidate:
        spec.num_nodes = hosts
        spec.model_fields_set.discard("num_nodes")  # still derived: an any_of candidate's plain spec re-derives it


def default_provider(data: dict[str, Any]) -> dict[str, Any]:
    """Before validation: a spec without ``provider:`` whose first candidate names one takes it as its
    ``provider`` (what `confirm_price` and the messages of a plain spec read)."""
    res = data.get("resources")
    cands = res.get("any_of") if isinstance(res, dict) else None
    if data.get("provider") is None and isinstance(cands, list) and cands and isinstance(cands[0], dict) \
            and isinstance(cands[0].get("provider"), str) and provider_known(cands[0]["provider"]):
        return {**data, "provider": cands[0]["provider"]}
    return data


def candidate_providers(spec: Any) -> list[str]:
    return [c.provider for c in spec.resources.any_of or [] if c.provider]
