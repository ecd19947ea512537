"""``gtrain check aws``: boto3's credential chain (and where it found them), ``sts:GetCallerIdentity`` (allowed
to every identity, changes nothing), the GPU instance families' on-demand vCPU quotas in the default region
(Service Quotas, where the identity may read them), and the SSH key gtrain gives the nodes. Read-only."""

from __future__ import annotations

from typing import Any

from gtrain.errors import CredentialsError
from gtrain.providers.base import ProviderCheck
from gtrain.providers.cloud.keys import key_note

#: botocore's names of where it found the credentials, in words
SOURCES = {
    "env": "the environment (AWS_ACCESS_KEY_ID)",
    "shared-credentials-file": "~/.aws/credentials",
    "config-file": "~/.aws/config",
    "sso": "an SSO login (~/.aws/sso)",
    "iam-role": "the instance role (EC2 metadata)",
    "container-role": "the container role",
    "assume-role": "an assumed role (~/.aws/config)",
    "assume-role-with-web-identity": "a web identity token (AWS_WEB_IDENTITY_TOKEN_FILE)",
    "custom-process": "a credential_process (~/.aws/config)",
}
#: the GPU families' on-demand vCPU quotas (gtrain.providers.aws.quota.CODES)
GPU_QUOTAS = (("P", "L-417A185B"), ("G", "L-DB2E81BA"))
FIX_LOGIN = "aws configure  (or: aws sso login --profile PROFILE; export AWS_PROFILE=PROFILE)"


def check(timeout: float) -> ProviderCheck:
    try:
        import boto3
        from botocore.config import Config
    except ModuleNotFoundError:
        return ProviderCheck("aws", False, "boto3 is not installed", fix="pip install 'gtrain[aws]'")
    from gtrain.providers.aws.api import translate

    key, key_fix = key_note()
    session = boto3.Session()
    try:
        creds = session.get_credentials()
    except Exception as e:  # noqa: BLE001 - a broken profile or config file: its one line
        err = translate(e, "reading the credentials")
        return ProviderCheck("aws", False, err.message, fix=err.hint or FIX_LOGIN, ssh_key=key)
    if creds is None:
        return ProviderCheck("aws", False, "no AWS credentials found (environment, ~/.aws, SSO, instance role)",
                             fix=FIX_LOGIN, ssh_key=key)
    profile = session.profile_name if session.profile_name != "default" else None
    where = SOURCES.get(creds.method, creds.method) + (f", profile {profile}" if profile else "")
    region = session.region_name or "us-east-1"
    cfg = Config(connect_timeout=min(timeout, 5.0), read_timeout=timeout, retries={"max_attempts": 1})
    try:
        ident = session.client("sts", region_name=region, config=cfg).get_caller_identity()
    except Exception as e:  # noqa: BLE001 - translated at this edge
        err = translate(e, "sts get-caller-identity")
        revoked = isinstance(err, CredentialsError)
        return ProviderCheck("aws", False, ("AWS refused the credentials: " if revoked else "") + err.message,
                             fix=(FIX_LOGIN if revoked else err.hint), credentials=where, ssh_key=key)
    call = f"sts get-caller-identity: account {ident.get('Account')} as {ident.get('Arn')}"
    quota = _gpu_quota(session, region, cfg)
    if key_fix:
        return ProviderCheck("aws", False, key, fix=key_fix, credentials=where, call=call, quota=quota, ssh_key=key)
    return ProviderCheck("aws", True, f"account {ident.get('Account')}, region {region}", credentials=where,
                         call=call, quota=quota, ssh_key=key)


def _gpu_quota(session: Any, region: str, cfg: Any) -> str:
    """The P and G families' on-demand vCPU quotas in ``region``, or why they cannot be told."""
    client = session.client("service-quotas", region_name=region, config=cfg)
    got = []
    for family, code in GPU_QUOTAS:
        try:
            q = client.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
        except Exception as e:  # noqa: BLE001 - the quota is a courtesy: say why it is not there
            code_of = getattr(e, "response", {}).get("Error", {}).get("Code") or type(e).__name__
            return f"cannot tell in {region} ({code_of})"
        got.append(f"{family} {float(q.get('Value') or 0):g}")
    return f"on-demand GPU vCPUs in {region}: " + ", ".join(got)
