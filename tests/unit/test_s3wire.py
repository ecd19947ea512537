"""The S3 wire client's pure parts: Signature V4 against AWS's published example, and where settings
(credentials, region, endpoint) come from. Requests themselves are tested against moto
(tests/integration/test_sync_s3.py), including moto checking our signatures."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from gtrain.sync.s3wire import EMPTY_SHA256, Signer, canonical_query, composite_sha256, resolve_settings

EXAMPLE_KEY = "AKIAIOSFODNN7EXAMPLE"
EXAMPLE_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def test_signature_matches_the_aws_documentation_example() -> None:
    # "Example: GET Object" of the S3 Signature Version 4 documentation (header-based auth)
    from gtrain.sync.s3wire import Credentials

    h = Signer().sign(Credentials(EXAMPLE_KEY, EXAMPLE_SECRET), "us-east-1", "GET", "examplebucket.s3.amazonaws.com",
                      "/test.txt", {}, {"range": "bytes=0-9"}, EMPTY_SHA256,
                      now=dt.datetime(2013, 5, 24, tzinfo=dt.UTC))
    assert h["authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
    assert h["x-amz-date"] == "20130524T000000Z"


def test_signature_agrees_with_botocore_for_a_session_token_a_query_and_odd_keys() -> None:
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCreds

    from gtrain.sync.s3wire import Credentials, _quote

    now = dt.datetime(2026, 12, 2, 14, 0, 0, tzinfo=dt.UTC)
    key = "runs/with space/ünï+$&.bin"
    path = _quote(f"/bucket/{key}", safe="/-_.~")
    query = {"partNumber": "3", "uploadId": "a/b+c=="}
    body = b"hello"
    import hashlib

    sha = hashlib.sha256(body).hexdigest()
    ours = Signer().sign(Credentials("AK", "SK", "TOKEN"), "eu-west-1", "PUT", "127.0.0.1:9000", path, query,
                         {"content-md5": "XUFAKrxLKna5cZ2REBfFkg==", "x-amz-meta-gtrain-sha256": sha}, sha, now=now)
    # botocore computes the signature of the same request (as moto does when it checks one)
    headers = {k: v for k, v in ours.items() if k != "authorization"}
    req = AWSRequest(method="PUT", url=f"http://127.0.0.1:9000{path}?{canonical_query(query)}", data=body,
                     headers=headers)
    req.context["timestamp"] = ours["x-amz-date"]
    auth = S3SigV4Auth(BotoCreds("AK", "SK", "TOKEN"), "s3", "eu-west-1")
    creq = auth.canonical_request(req)
    assert ours["authorization"].endswith("Signature=" + auth.signature(auth.string_to_sign(req, creq), req))


def test_composite_sha256_is_sha256_of_part_sha256s() -> None:
    """S3's COMPOSITE checksum: base64(sha256(part digests, in order)) + "-N" (that a server answers the same
    is tested against SeaweedFS: tests/integration/test_sync_s3_wire.py)."""
    import base64
    import hashlib

    parts = [b"a" * 10, b"b" * 3]
    digests = [hashlib.sha256(p).digest() for p in parts]
    want = base64.b64encode(hashlib.sha256(b"".join(digests)).digest()).decode() + "-2"
    assert composite_sha256(digests) == want
    assert composite_sha256(digests[::-1]) != want  # the order of the parts counts


def write(p: Path, text: str) -> str:
    p.write_text(text)
    return str(p)


def test_settings_from_environment_first(tmp_path: Path) -> None:
    env = {"AWS_ACCESS_KEY_ID": "A", "AWS_SECRET_ACCESS_KEY": "S", "AWS_SESSION_TOKEN": "T",
           "AWS_DEFAULT_REGION": "eu-central-1", "AWS_ENDPOINT_URL": "http://x:1", "AWS_ENDPOINT_URL_S3": "http://s3:2",
           "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    s = resolve_settings(env=env)
    assert (s.static.access_key, s.static.secret_key, s.static.token) == ("A", "S", "T")  # type: ignore[union-attr]
    assert (s.region, s.endpoint_url, s.needs_botocore_credentials) == ("eu-central-1", "http://s3:2", False)
    assert resolve_settings(env={**env, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"}).endpoint_url is None


def test_settings_from_a_profile_with_static_keys(tmp_path: Path) -> None:
    env = {"AWS_PROFILE": "dev",
           "AWS_CONFIG_FILE": write(tmp_path / "config", "[profile dev]\nregion = us-west-2\n"
                                    "endpoint_url = https://minio.local:9000\n"),
           "AWS_SHARED_CREDENTIALS_FILE": write(tmp_path / "credentials",
                                                "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n"
                                                "[dev]\naws_access_key_id = K\naws_secret_access_key = KS\n")}
    s = resolve_settings(env=env)
    assert s.static is not None and (s.static.access_key, s.static.secret_key) == ("K", "KS")
    assert (s.region, s.endpoint_url, s.needs_botocore_endpoint) == ("us-west-2", "https://minio.local:9000", False)


@pytest.mark.parametrize("extra", ["role_arn = arn:aws:iam::1:role/r\nsource_profile = default",
                                   "sso_session = corp", "credential_process = /bin/creds"])
def test_profiles_botocore_must_resolve_go_to_botocore(tmp_path: Path, extra: str) -> None:
    env = {"AWS_PROFILE": "p", "AWS_CONFIG_FILE": write(tmp_path / "config", f"[profile p]\n{extra}\n"),
           "AWS_SHARED_CREDENTIALS_FILE": write(tmp_path / "credentials",
                                                "[p]\naws_access_key_id = K\naws_secret_access_key = KS\n")}
    assert resolve_settings(env=env).needs_botocore_credentials


@pytest.mark.parametrize(("config", "env"), [
    ("services = local\n", {}), ("s3 =\n  addressing_style = virtual\n", {}), ("use_fips_endpoint = true\n", {}),
    ("", {"AWS_USE_DUALSTACK_ENDPOINT": "true"})])
def test_endpoint_settings_we_do_not_model_go_to_botocore(tmp_path: Path, config: str, env: dict[str, str]) -> None:
    env = {**env, "AWS_ACCESS_KEY_ID": "A", "AWS_SECRET_ACCESS_KEY": "S",
           "AWS_CONFIG_FILE": write(tmp_path / "config", f"[default]\n{config}"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    assert resolve_settings(env=env).needs_botocore_endpoint
