"""One JSON-over-HTTPS client for the clouds gtrain reaches through a REST API and no SDK (Lambda, RunPod, Vast;
Nebius speaks gRPC through its SDK instead): stdlib ``urllib`` only, so ``--help`` and ``status`` load nothing of it.

What every such API needs, written once: the key in a header (never in a URL, a log or an error), a JSON body,
the 429 answer retried after its ``Retry-After`` (else an exponential backoff), 5xx retried a few times, an
optional pacer that spaces the requests of the whole process, and every other error answer handed to the
provider's own ``translate`` -- the one place a provider's errors become gtrain's. A provider's client subclasses
:class:`JSONClient` and sets what differs (its name, the header, the retry budget, the translation)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from gtrain.errors import GtrainError, ProviderError


class Unreachable(ProviderError):
    """The API did not answer (no network, a refused connection, a timeout)."""


def parse_body(raw: bytes) -> Any:
    """An answer's body as JSON, None when it is empty or not JSON (an error page of a proxy)."""
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def retry_after(value: str | None) -> float:
    """``Retry-After`` in seconds (its delta-seconds form; an HTTP date or garbage reads as 0)."""
    try:
        return max(0.0, float(value or 0))
    except ValueError:
        return 0.0


class JSONClient:
    """A client of one JSON REST API. Subclasses set :attr:`service` (for messages), :attr:`env_url` (the
    override of the endpoint named in "cannot reach" hints), and implement :meth:`auth_headers` and
    :meth:`translate`."""

    service: ClassVar[str] = "the API"
    env_url: ClassVar[str] = ""
    #: 5xx answers retried before the error is raised (0: a 5xx is final)
    retry_5xx: ClassVar[int] = 3
    #: the longest wait for one 429
    max_wait_429_s: ClassVar[float] = 60.0
    backoff_429_s: ClassVar[float] = 0.2

    def __init__(self, base_url: str, timeout: float = 30.0, max_429: int = 8,
                 pace: Callable[[str, str], None] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_429 = max_429
        self._pace = pace

    # ---- what a provider sets ----

    def auth_headers(self) -> dict[str, str]:  # pragma: no cover - every provider overrides it
        raise NotImplementedError

    def translate(self, status: int, body: Any, what: str) -> GtrainError:  # pragma: no cover - overridden
        raise NotImplementedError

    # ---- the one request loop ----

    def url(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        q = {k: v for k, v in (query or {}).items() if v is not None}
        return f"{self.base_url}{path}" + (f"?{urllib.parse.urlencode(q, doseq=True)}" if q else "")

    def call(self, method: str, path: str, body: Any = None, what: str | None = None,
             query: Mapping[str, Any] | None = None) -> Any:
        """One request; its JSON answer ({} when the body is empty). 429 and 5xx retried; any other error, or
        the last retry's, raised as the provider's :meth:`translate` makes it."""
        what = what or f"{method} {path}"
        data = json.dumps(body).encode() if body is not None else None
        url = self.url(path, query)
        fails = 0
        attempt = 0
        while True:
            if self._pace is not None:
                self._pace(method, path)
            req = urllib.request.Request(url, data=data, method=method, headers={
                **self.auth_headers(), "Accept": "application/json",
                **({"Content-Type": "application/json"} if data is not None else {})})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:  # noqa: S310 - https or a fake
                    raw = r.read()
                return json.loads(raw) if raw else {}
            except urllib.error.HTTPError as e:
                parsed = parse_body(e.read())
                if e.code == 429 and attempt < self.max_429:
                    wait = retry_after(e.headers.get("Retry-After"))
                    time.sleep(min(self.max_wait_429_s, max(wait, self.backoff_429_s * 2 ** min(attempt, 5))))
                    attempt += 1
                    continue
                if e.code >= 500 and fails < self.retry_5xx:
                    fails += 1
                    time.sleep(0.5 * 2 ** fails)
                    continue
                raise self.translate(e.code, parsed, what) from None
            except (urllib.error.URLError, OSError) as e:
                reason = getattr(e, "reason", e)
                hint = f"check the network (or {self.env_url})" if self.env_url else "check the network"
                raise Unreachable(f"{what}: cannot reach {self.service} at {self.base_url} ({reason})",
                                  hint=hint) from None
