"""gtrain's exception tree. Only ``gtrain.cli.app`` turns these into exit codes and text.

    GtrainError(message, hint)             exit 1 unless a subclass says otherwise
    ├── ConfigError(message, hint, field)  exit 2: bad spec, bad flag, bad value
    │   └── ClusterNotFound                exit 2: no such cluster in state
    ├── StateError                         the state database is unusable
    ├── JobConflict                        exit 2: a job already runs on the cluster
    ├── ProviderError                      a cloud/provider call failed (translated at the provider edge)
    │   ├── CapacityError                  no capacity anywhere we tried (carries the attempts)
    │   ├── QuotaError                     an account limit
    │   └── CredentialsError               no or bad credentials
    ├── RemoteError                        a node could not be reached / host key refused
    ├── RemoteCommandError(host, cmd, rc, stderr_tail)
    └── SyncError                          a transfer failed or did not verify

Provider SDK exceptions (botocore, google.api_core, paramiko) never cross a provider module:
each provider translates them in one place into this tree.

Every error scrubs registered secret values (:mod:`gtrain.redact`) from its message and hint when it is made,
so neither ``--json`` output, a traceback nor a stored error can show one.
"""

from __future__ import annotations

from collections.abc import Iterable


def scrub(text: str) -> str:
    """:func:`gtrain.redact.scrub`; the identity where that module is absent (the node-side sync bundle ships
    this file alone, and no secret is registered in a process there)."""
    try:
        from gtrain.redact import scrub as _scrub
    except ImportError:
        return text
    return _scrub(text)


class GtrainError(Exception):
    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        message = scrub(message)
        hint = scrub(hint) if hint else hint
        super().__init__(message)
        self.message = message
        self.hint = hint

    def to_dict(self) -> dict[str, object]:
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint}


class ConfigError(GtrainError):
    """Bad input: the field path, the bad value and how to fix it. Exit code 2."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None, field: str | None = None) -> None:
        super().__init__(message, hint)
        self.field = field

    def to_dict(self) -> dict[str, object]:
        d = super().to_dict()
        d["field"] = self.field
        return d


class ClusterNotFound(ConfigError):
    def __init__(self, name: str, gone: bool = False) -> None:
        if gone:  # torn down: what gtrain kept of it is still there
            super().__init__(f"cluster {name!r} was torn down", field="cluster",
                             hint=f"what it left: `gtrain logs {name}`, `gtrain report {name}`, `gtrain cost`; "
                                  "`gtrain up SPEC` makes it again")
        else:
            super().__init__(f"no cluster named {name!r}", field="cluster",
                             hint="`gtrain status` lists clusters; `gtrain up SPEC` makes one")
        self.name = name


class JobConflict(GtrainError):
    exit_code = 2


class StateError(GtrainError):
    pass


class ProviderError(GtrainError):
    pass


class CapacityError(ProviderError):
    def __init__(self, message: str, attempts: list[str] | None = None, hint: str | None = None) -> None:
        self.attempts = [scrub(a) for a in attempts or []]
        if self.attempts:
            message = message + "\n" + "\n".join(f"  - {a}" for a in self.attempts)
        super().__init__(message, hint)


class QuotaError(ProviderError):
    pass


class CredentialsError(ProviderError):
    pass


class RemoteError(GtrainError):
    pass


class RemoteCommandError(RemoteError):
    def __init__(self, host: str, cmd: str, rc: int, stderr_tail: str = "") -> None:
        short = cmd if len(cmd) <= 120 else cmd[:117] + "..."
        msg = f"command failed on {host} (exit {rc}): {short}"
        if stderr_tail.strip():
            msg += "\n" + stderr_tail.rstrip()[-2000:]
        super().__init__(msg)
        self.host, self.cmd, self.rc, self.stderr_tail = host, scrub(cmd), rc, scrub(stderr_tail)


class SyncError(GtrainError):
    pass


def dotted_path(parts: Iterable[object]) -> str:
    """``("job", "data", 0, "src")`` -> ``job.data[0].src`` (None is skipped)."""
    out = ""
    for part in parts:
        if part is None:
            continue
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out


#: the distribution's name (pyproject.toml). Not yet published: the ``gtrain`` on PyPI is an unrelated project,
#: so an install hint never names the index unless this gtrain came from it (:func:`install_hint`)
DIST = "gtrain-cli"


def install_hint(extra: str) -> str:
    """How to add ``extra`` to this gtrain, from where it was installed (PEP 610's ``direct_url.json``): its
    checkout, its wheel, its git URL, or the index only where it came from the index."""
    import json
    from importlib.metadata import PackageNotFoundError, distribution
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    try:
        raw = distribution(DIST).read_text("direct_url.json")
    except PackageNotFoundError:  # run from a checkout that was never installed
        root = Path(__file__).resolve().parents[1]
        return f"pip install -e '{root}[{extra}]'" if (root / "pyproject.toml").is_file() else \
            f"pip install -e './gtrain[{extra}]' (from a checkout of gtrain)"
    if not raw:
        return f"pip install '{DIST}[{extra}]'"
    try:
        d = json.loads(raw)
    except ValueError:
        return f"pip install '{DIST}[{extra}]'"
    url = str(d.get("url") or "")
    if "vcs_info" in d:
        return f"pip install '{DIST}[{extra}] @ {d['vcs_info'].get('vcs', 'git')}+{url}'"
    where = unquote(urlparse(url).path) if url.startswith("file://") else url
    editable = bool((d.get("dir_info") or {}).get("editable"))
    return f"pip install {'-e ' if editable else ''}'{where}[{extra}]'"

