"""Pydantic's validation errors as one gtrain line: each problem names the field path, the bad value (short)
and the fix; an unknown field gets its closest known name."""

from __future__ import annotations

import difflib
import reprlib
from typing import Any

from pydantic import BaseModel, ValidationError

from gtrain.errors import ConfigError, dotted_path
from gtrain.spec.data import MAX_PROBLEMS


def _loc(loc: tuple[Any, ...]) -> str:
    return dotted_path(loc) or "spec"


def _models_in(ann: Any) -> list[type[BaseModel]]:
    """The models a field's annotation holds (``X | None``, ``list[X]``, ``Annotated[...]``)."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    return [m for a in getattr(ann, "__args__", ()) for m in _models_in(a)]


def _known_fields(model: type[BaseModel], loc: tuple[Any, ...], top: type[BaseModel]) -> list[str]:
    cur: Any = model
    for part in loc[:-1]:
        if isinstance(part, int) or not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            continue
        f = cur.model_fields.get(str(part)) or next(  # a field named by its alias (`lambda:`, a provider section)
            (fi for fi in cur.model_fields.values() if fi.alias == str(part)), None)
        if f is None:
            return []
        cands = _models_in(f.annotation)
        cur = cands[0] if cands else None
    if cur is top:
        from gtrain.spec.anyof import _provider_choices

        return [k for k in cur.model_fields if k != "base_dir"] + _provider_choices()
    if isinstance(cur, type) and issubclass(cur, BaseModel):
        return [fi.alias or k for k, fi in cur.model_fields.items() if k != "base_dir"]
    return []


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 6, 6, 60, 60, 40


def _short(v: Any) -> str:
    """A repr of at most 60 characters that never walks more than a few items of a big value."""
    s = _REPR.repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def translate(err: ValidationError, model: type[BaseModel], top: type[BaseModel]) -> ConfigError:
    """``err`` of ``model`` (``top``: the spec's top model, whose unknown fields also name the providers)."""
    lines: list[str] = []
    first_field: str | None = None
    hint: str | None = None
    errors = err.errors(include_url=False)
    for e in errors[:MAX_PROBLEMS]:
        loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        path = _loc(loc)
        first_field = first_field or path
        typ = e["type"]
        if typ == "extra_forbidden":
            known = _known_fields(model, loc, top)
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            fix = f"did you mean '{close[0]}'?" if close else f"known fields here: {', '.join(known)}"
            lines.append(f"{path}: unknown field — {fix}")
        elif typ == "missing":
            lines.append(f"{path}: required field is missing")
            hint = hint or "see docs/spec.md for every field"
        elif typ == "literal_error":
            expected = e.get("ctx", {}).get("expected", "")
            lines.append(f"{path}: {_short(e.get('input'))} is not one of {expected}")
        else:
            msg = e["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            value = e.get("input")
            # a rule over a whole mapping (a provider section, secrets vs env) names no single value
            lines.append(f"{path}: {msg}" if isinstance(value, dict) else f"{path}: {_short(value)} — {msg}")
    if len(errors) > MAX_PROBLEMS:  # 24,000 unknown keys: the first few and a count, not a 3 MB line
        lines.append(f"and {len(errors) - MAX_PROBLEMS} more problem(s)")
    return ConfigError("invalid spec: " + "; ".join(lines), hint=hint, field=first_field)
