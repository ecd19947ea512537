"""The field tables of docs/spec.md, written from the pydantic models in :mod:`gtrain.spec`.

``python -m gtrain.spec.doc`` rewrites the tables between the ``<!-- BEGIN fields X -->`` / ``<!-- END fields X
-->`` markers and leaves the prose around them alone; ``--check`` exits 1 when the file is out of date
(tests/unit/test_spec_docs.py runs it).
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gtrain.spec import ClusterSpec, DataEntry, Job, Policies, Resources
from gtrain.spec.anyof import Candidate
from gtrain.spec.notify import EmailTarget, EnergySpec, NotifySpec, Tracking, WebhookTarget
from gtrain.spec.volumes import Volume

DOC = Path(__file__).resolve().parents[2] / "docs" / "spec.md"
TABLES: dict[str, type[BaseModel]] = {
    "top": ClusterSpec, "resources": Resources, "resources.any_of": Candidate, "job": Job, "job.data": DataEntry,
    "policies": Policies, "notify": NotifySpec, "notify.webhook": WebhookTarget, "notify.email": EmailTarget,
    "energy": EnergySpec, "job.tracking": Tracking, "volumes": Volume,
}
_BLOCK = re.compile(r"(<!-- BEGIN fields (?P<key>[\w.]+) [^>]*-->\n).*?(<!-- END fields (?P=key) -->)", re.S)


def type_name(ann: Any) -> str:
    origin, args = get_origin(ann), get_args(ann)
    if origin is Annotated:
        return type_name(args[0])
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return " or ".join(type_name(a) for a in rest) + (" or null" if len(rest) < len(args) else "")
    if origin is list:
        inner = type_name(args[0])
        return "list of mappings" if inner == "mapping" else f"list of {inner}s"
    if origin is dict:
        return f"mapping of {type_name(args[0])} to {type_name(args[1])}"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "mapping"
    return {str: "string", int: "integer", float: "number", bool: "bool"}.get(ann, str(ann))


def default_text(f: FieldInfo) -> str:
    if f.is_required():
        return "required"
    if f.default_factory is not None:
        value = f.default_factory()  # type: ignore[call-arg]
        return "all defaults" if isinstance(value, BaseModel) else f"`{value!r}`"
    if f.default is None or f.default is PydanticUndefined:
        return "null"
    return f"`{str(f.default).lower() if isinstance(f.default, bool) else f.default}`"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def constraints(f: FieldInfo) -> str:
    bounds: dict[str, Any] = {}
    for m in f.metadata:
        for name in ("ge", "gt", "le", "lt", "min_length"):
            if isinstance(m, getattr(at, {"min_length": "MinLen"}.get(name, name.capitalize()))):
                bounds[name] = getattr(m, name)
        if getattr(m, "allow_inf_nan", None) is False:
            bounds["finite"] = True
    out = []
    if "ge" in bounds and "le" in bounds:
        out.append(f"{_num(bounds['ge'])}..{_num(bounds['le'])}")
    else:
        out += [f"> {_num(bounds['gt'])}"] if "gt" in bounds else []
        out += [f"≥ {_num(bounds['ge'])}"] if "ge" in bounds else []
        out += [f"≤ {_num(bounds['le'])}"] if "le" in bounds else []
    out += ["finite"] if bounds.get("finite") else []
    out += ["not empty"] if bounds.get("min_length") else []
    return ", ".join(out)


def table(model: type[BaseModel]) -> str:
    rows = ["| field | type | default | constraints and meaning |", "|---|---|---|---|"]
    for name, f in model.model_fields.items():
        if f.exclude:
            continue
        what = "; ".join(x for x in (constraints(f), f.description or "") if x).replace("|", "\\|")
        rows.append(f"| `{name}` | {type_name(f.annotation)} | {default_text(f)} | {what} |")
    if model is ClusterSpec:
        from gtrain.registry import PLANNED, REGISTRY

        names = ", ".join(f"`{n}`" for n in sorted({*REGISTRY, *PLANNED}))
        rows.append(f"| {names}, or a plug-in's name | mapping or absent | absent | the section of the chosen "
                    "provider (only that one); see [Provider sections](#provider-sections) |")
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    def fill(m: re.Match[str]) -> str:
        return m.group(1) + table(TABLES[m.group("key")]) + m.group(3)

    out = _BLOCK.sub(fill, text)
    missing = [k for k in TABLES if f"<!-- BEGIN fields {k} " not in out]
    if missing:
        raise SystemExit(f"{DOC}: no markers for {missing}")
    return out


def main(argv: list[str]) -> int:
    text = DOC.read_text(encoding="utf-8")
    new = render(text)
    if "--check" in argv:
        if new != text:
            raise SystemExit(f"{DOC} is out of date with gtrain/spec/__init__.py: run python -m gtrain.spec.doc")
        return 0
    DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
