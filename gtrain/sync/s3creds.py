"""Where the S3 client gets its credentials and endpoint: the environment (``AWS_ACCESS_KEY_ID`` / ...), static
keys of the profile in the shared credentials / config files, and for every other source (SSO, assume-role,
web identity, ``credential_process``, container and instance roles) botocore's own chain, imported only then.
Used by :mod:`gtrain.sync.s3wire` (which re-exports these names); stdlib only otherwise."""

from __future__ import annotations

import configparser
import os
from dataclasses import dataclass

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

    region = env.get("AWS_DEFAULT_REGION") or config.get("region") or "us-east-1"
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
