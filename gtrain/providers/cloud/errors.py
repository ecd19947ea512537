"""The cloud's own error code, kept on the gtrain error it was translated into (``.code``: what failover and
"not found" checks read; ``""`` when there is none)."""

from __future__ import annotations

from typing import TypeVar

from gtrain.errors import GtrainError

E = TypeVar("E", bound=GtrainError)


def with_code(err: E, code: str) -> E:
    setattr(err, "code", code)  # noqa: B010 - GtrainError has no code field; the clouds' errors carry one
    return err


def code_of(err: BaseException) -> str:
    return str(getattr(err, "code", "") or "")
