"""The shared state's edge: every error of the store's wire (``gtrain.sync.condput`` over ``s3wire``, ``gcswire``,
``azwire``) becomes one of gtrain's here, naming ``GTRAIN_STATE`` (or the config file's ``state``), its value
and what to do. The wires fail at once where the endpoint refuses, does not resolve or does not answer within
``condput.TIMEOUT_S`` (``fail_fast``), so a store that is down ends a command in well under a second, one that
hangs in a few seconds, never after minutes of retries.

- cannot reach (refused, no answer, unknown host), a server error: :class:`StateError` (exit 1);
- no credentials, refused credentials (401 / 403): :class:`CredentialsError` (exit 1);
- the bucket or container does not exist: :class:`ConfigError` naming the field (exit 2).

A :class:`~gtrain.sync.condput.Conflict` (another writer won) passes through: the store's callers merge on it.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from gtrain.errors import ConfigError, CredentialsError, GtrainError, StateError

if TYPE_CHECKING:
    from gtrain.sync.condput import CondStore, Obj
    from gtrain.sync.model import RemoteURL

T = TypeVar("T")
_ENDPOINT = re.compile(r"^(?:\w+: )?(\w+://[^\s/]+?):\s")
_MISSING = ("NoSuchBucket", "ContainerNotFound")


def _root(e: BaseException) -> BaseException | None:
    """The transport error under ``e`` (refused, timed out, no such host), through causes and contexts."""
    seen: BaseException | None = e
    for _ in range(12):
        if seen is None:
            return None
        if isinstance(seen, ConnectionRefusedError | TimeoutError | socket.gaierror):
            return seen
        if type(seen).__name__ in ("ReadTimeoutError", "ConnectTimeoutError", "NameResolutionError"):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def translate(e: Exception, fld: str, value: str, doing: str, timeout_s: float) -> GtrainError:
    """One line for what went wrong with the shared state while ``doing`` (e.g. "reading leases/x.json")."""
    if isinstance(e, GtrainError):
        return e
    name = type(e).__name__
    text = " ".join(str(getattr(e, "message", "") or e).split())
    where = f"shared state {value} ({fld})"
    fix = f"check {fld} and the network, or unset {fld} to work from this machine's state only"
    if name == "NoCredentials" or name == "DefaultCredentialsError":
        return CredentialsError(f"{where}: no credentials for the store: {text}",
                                hint=f"give this machine the store's credentials (docs/state.md), or unset {fld}")
    status = getattr(e, "status", None)
    if not isinstance(status, int):
        code_attr = getattr(e, "code", None)  # google.api_core's exceptions carry the HTTP status as `code`
        status = code_attr if isinstance(code_attr, int) else 0
    code = str(getattr(e, "code", "") or "")
    root = _root(e)
    m = _ENDPOINT.match(str(getattr(e, "message", "") or e))
    endpoint = m.group(1) if m else "its endpoint"
    if root is not None or name == "Broken" or (status == 0 and name.endswith("WireError")):
        if isinstance(root, ConnectionRefusedError):
            why = "the connection was refused"
        elif isinstance(root, socket.gaierror) or type(root).__name__ == "NameResolutionError":
            why = "its host name does not resolve"
        elif root is not None:
            why = f"no answer in {timeout_s:g} s"
        else:
            why = text
        return StateError(f"{where}: cannot reach {endpoint} while {doing}: {why}",
                          hint=f"is the store's endpoint right and up? {fix}")
    if status in (401, 403):
        return CredentialsError(f"{where}: the store refused this machine's credentials while {doing} "
                                f"({status} {code}): {text}",
                                hint=f"check the credentials for the store (docs/state.md), or unset {fld}")
    if code in _MISSING or (status == 404 and "bucket" in text.lower()):
        return ConfigError(f"{where}: the bucket or container does not exist ({text})", field=fld,
                           hint=f"create it, or point {fld} at one that exists")
    return StateError(f"{where}: {doing} failed: {name}: {text}", hint=fix)


class Guarded:
    """A ``CondStore`` whose every error but ``Conflict`` is one of gtrain's (:func:`translate`)."""

    def __init__(self, make: Callable[[], CondStore], url: RemoteURL, fld: str, value: str) -> None:
        from gtrain.sync.condput import TIMEOUT_S

        self.url, self.fld, self.value, self.timeout_s = url, fld, value, TIMEOUT_S
        self.inner = self._call(make, "opening the store")

    def _call(self, fn: Callable[[], T], doing: str) -> T:
        from gtrain.sync.condput import Conflict

        try:
            return fn()
        except Conflict:
            raise
        except Exception as e:  # noqa: BLE001 - every wire's error, translated here once
            raise translate(e, self.fld, self.value, doing, self.timeout_s) from None

    def get(self, key: str) -> Obj | None:
        return self._call(lambda: self.inner.get(key), f"reading {key}")

    def put(self, key: str, data: bytes, *, match: str | None = None, absent: bool = False) -> str:
        return self._call(lambda: self.inner.put(key, data, match=match, absent=absent), f"writing {key}")

    def list(self, prefix: str = "") -> dict[str, str]:
        return self._call(lambda: self.inner.list(prefix), f"listing {prefix or '/'}")

    def delete(self, key: str) -> None:
        self._call(lambda: self.inner.delete(key), f"deleting {key}")

    def close(self) -> None:
        self.inner.close()
