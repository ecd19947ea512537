"""Where S3 requests go and who signs them: the environment / profile settings, credentials (static, or
botocore's chain for everything else) and Signature V4. Stdlib only (botocore imported only when its chain
is needed). Used by :mod:`gtrain.sync.s3wire`."""

from __future__ import annotations

import configparser
import datetime as _dt
import hashlib
import hmac
import os
import threading
import urllib.parse
from dataclasses import dataclass

_UNRESERVED = "-_.~"
# profile keys that mean "botocore resolves the credentials" (its chain puts them before the static keys)
_COMPLEX_CRED_KEYS = ("role_arn", "credential_source", "source_profile", "web_identity_token_file",
                      "sso_session", "sso_start_url", "credential_process", "login_session")
# profile keys that change the endpoint in ways this module does not model
_COMPLEX_ENDPOINT_KEYS = ("services", "s3", "use_fips_endpoint", "use_dualstack_endpoint")


class NoCredentials(Exception):
    pass


# ---------------------------------------------------------------------------------------------- credentials


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    token: str | None = None


def _read_ini(path: str) -> configparser.RawConfigParser:
    cp = configparser.RawConfigParser()
    try:
        cp.read(os.path.expanduser(path), encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        pass
    return cp


def _section(cp: configparser.RawConfigParser, *names: str) -> dict[str, str]:
    for n in names:
        if cp.has_section(n):
            return {k.lower(): v.strip() for k, v in cp.items(n)}
    return {}


@dataclass
class Settings:
    """What the environment and the profile say: region, endpoint, where credentials come from."""

    profile: str | None
    region: str
    endpoint_url: str | None
    static: Credentials | None
    needs_botocore_credentials: bool
    needs_botocore_endpoint: bool
    ca_bundle: str | None


def resolve_settings(profile: str | None = None, env: dict[str, str] | None = None) -> Settings:
    env = dict(os.environ) if env is None else env
    explicit_profile = profile
    profile = profile or env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE")
    name = profile or "default"
    config = _section(_read_ini(env.get("AWS_CONFIG_FILE", "~/.aws/config")), f"profile {name}", name)
    creds_file = _section(_read_ini(env.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")), name)

    static: Credentials | None = None
    if not explicit_profile and env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        static = Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"],
                             env.get("AWS_SESSION_TOKEN") or None)
    complex_creds = any(k in config for k in _COMPLEX_CRED_KEYS) or "credential_process" in creds_file
    if static is None and not complex_creds:
        for src in (creds_file, config):
            if src.get("aws_access_key_id") and src.get("aws_secret_access_key"):
                static = Credentials(src["aws_access_key_id"], src["aws_secret_access_key"],
                                     src.get("aws_session_token") or None)
                break

    # AWS_REGION first, as the other AWS SDKs and the CLI v2 read it (botocore reads only AWS_DEFAULT_REGION)
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or config.get("region") or "us-east-1"
    endpoint: str | None = None
    complex_endpoint = False
    if env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() != "true" and \
            config.get("ignore_configured_endpoint_urls", "").lower() != "true":
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        if endpoint is None:
            endpoint = config.get("endpoint_url") or None
            complex_endpoint = "services" in config
    complex_endpoint = complex_endpoint or any(k in config for k in _COMPLEX_ENDPOINT_KEYS if k != "services") \
        or any(env.get(k, "").lower() == "true" for k in ("AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT",
                                                          "AWS_S3_USE_ARN_REGION"))
    return Settings(profile=profile, region=region, endpoint_url=endpoint, static=static,
                    needs_botocore_credentials=static is None, needs_botocore_endpoint=complex_endpoint,
                    ca_bundle=env.get("AWS_CA_BUNDLE") or config.get("ca_bundle") or None)


class _BotocoreCredentials:
    """botocore's full credential chain, for sources this module does not read itself."""

    def __init__(self, profile: str | None) -> None:
        import botocore.session

        self.session = botocore.session.Session(profile=profile)
        creds = self.session.get_credentials()
        if creds is None:
            raise NoCredentials("no AWS credentials found (environment, profile, SSO, role or instance metadata)")
        self._creds = creds

    def get(self) -> Credentials:
        f = self._creds.get_frozen_credentials()  # refreshes temporary credentials when they near expiry
        return Credentials(f.access_key, f.secret_key, f.token or None)


# ---------------------------------------------------------------------------------------------- signing


def _quote(s: str, safe: str = _UNRESERVED) -> str:
    return urllib.parse.quote(s, safe=safe)


def canonical_query(query: dict[str, str]) -> str:
    return "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items()))


class Signer:
    """AWS Signature Version 4 for S3 (payload signed by its sha256, path not double-encoded)."""

    def __init__(self) -> None:
        self._keys: dict[tuple[str, str, str], bytes] = {}
        self._lock = threading.Lock()

    def _key(self, secret: str, date: str, region: str) -> bytes:
        k = (secret, date, region)
        with self._lock:
            got = self._keys.get(k)
        if got is None:
            got = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
            for part in (region, "s3", "aws4_request"):
                got = hmac.new(got, part.encode(), hashlib.sha256).digest()
            with self._lock:
                self._keys[k] = got
        return got

    def sign(self, creds: Credentials, region: str, method: str, host: str, path: str, query: dict[str, str],
             headers: dict[str, str], payload_sha256: str, now: _dt.datetime | None = None) -> dict[str, str]:
        """``headers`` (lower-case names) plus host, x-amz-date, x-amz-content-sha256, the session token and
        Authorization. ``path`` is already percent-encoded."""
        now = now or _dt.datetime.now(_dt.UTC)
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        date = amz_date[:8]
        out = dict(headers)
        out["host"] = host
        out["x-amz-date"] = amz_date
        out["x-amz-content-sha256"] = payload_sha256
        if creds.token:
            out["x-amz-security-token"] = creds.token
        names = sorted(out)
        canonical_headers = "".join(f"{n}:{' '.join(str(out[n]).split())}\n" for n in names)
        signed = ";".join(names)
        creq = "\n".join([method, path, canonical_query(query), canonical_headers, signed, payload_sha256])
        scope = f"{date}/{region}/s3/aws4_request"
        sts = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(creq.encode()).hexdigest()])
        sig = hmac.new(self._key(creds.secret_key, date, region), sts.encode(), hashlib.sha256).hexdigest()
        out["authorization"] = (f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, "
                                f"SignedHeaders={signed}, Signature={sig}")
        return out
