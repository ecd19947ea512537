"""``gtrain check nebius``: the credentials (``NEBIUS_IAM_TOKEN``, else a profile of the nebius CLI's
``~/.nebius/config.yaml``: a service account's key or the CLI's federation login), whether the ``nebius`` extra (the
SDK) is installed, then one harmless call with them: ``InstanceService.List`` in the project ``NEBIUS_PROJECT_ID``
names (Nebius lists by project: without one, no call is made and the fix says how to name it), and the SSH key gtrain
gives the instances. The GPU quota is not read. Without credentials nothing of the SDK is imported."""

from __future__ import annotations

import os

from gtrain.errors import CredentialsError, GtrainError
from gtrain.providers.base import ProviderCheck
from gtrain.providers.cloud.keys import key_note
from gtrain.providers.nebius.api import ENV_TOKEN, KEY_HINT, NebiusAPI, credentials_source, sdk_missing

FIX = f"export {ENV_TOKEN}=$(nebius iam get-access-token)  (or `nebius profile create`)"
ENV_PROJECT = "NEBIUS_PROJECT_ID"
QUOTA = "not read (console: Administration > Quotas)"


def check(timeout: float) -> ProviderCheck:
    key, key_fix = key_note()
    where = credentials_source()
    if where is None:
        return ProviderCheck("nebius", False, f"no credentials ({ENV_TOKEN} unset, no profile in "
                             "~/.nebius/config.yaml)", fix=FIX, ssh_key=key)
    try:
        import nebius  # noqa: F401 - only whether the extra is installed
    except ImportError:
        e = sdk_missing()
        return ProviderCheck("nebius", False, e.message, fix=e.hint, credentials=where, ssh_key=key)
    project = os.environ.get(ENV_PROJECT, "").strip()
    if not project:
        return ProviderCheck("nebius", False, f"no project to list instances in ({ENV_PROJECT} unset)",
                             fix=f"export {ENV_PROJECT}=project-e00...  (`nebius iam project list`)",
                             credentials=where, quota=QUOTA, ssh_key=key)
    api = NebiusAPI(timeout=timeout)
    try:
        n = len(api.instances(project))
    except CredentialsError as e:
        return ProviderCheck("nebius", False, e.message, fix=FIX, credentials=where, ssh_key=key)
    except GtrainError as e:
        return ProviderCheck("nebius", False, e.message, fix=e.hint or KEY_HINT, credentials=where, ssh_key=key)
    finally:
        api.close()
    call = f"InstanceService.List {project}: {n} instance(s)"
    if key_fix:
        return ProviderCheck("nebius", False, key, fix=key_fix, credentials=where, call=call, quota=QUOTA,
                             ssh_key=key)
    return ProviderCheck("nebius", True, f"{n} instance(s) listed in {project}", credentials=where, call=call,
                         quota=QUOTA, ssh_key=key)
