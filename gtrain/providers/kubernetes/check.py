"""``gtrain check kubernetes``: the kubeconfig (``KUBECONFIG`` or ``~/.kube/config``, or a pod's service account)
and its current context, a read of the namespace (``GTRAIN_KUBE_NAMESPACE``, else ``default``), and the GPUs
the nodes offer (``nvidia.com/gpu`` allocatable, where the identity may list nodes). Read-only. The pods get no
SSH key: gtrain reaches them through the API server (pods/exec)."""

from __future__ import annotations

import os
from pathlib import Path

from gtrain.errors import GtrainError
from gtrain.providers.base import ProviderCheck

FIX_CONFIG = "export KUBECONFIG=/path/to/kubeconfig  (or: kubectl config use-context NAME)"
NO_KEY = "none: pods are reached through the API server (pods/exec)"


def _where() -> str | None:
    token = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    if os.environ.get("KUBERNETES_SERVICE_HOST") and token.exists():
        return "the in-cluster service account"
    path = Path(os.environ.get("KUBECONFIG") or "~/.kube/config").expanduser()
    return f"kubeconfig {path}" if path.is_file() else None


def check(timeout: float) -> ProviderCheck:
    where = _where()
    if where is None:
        return ProviderCheck("kubernetes", False, "no kubeconfig (KUBECONFIG, ~/.kube/config) and not in a pod",
                             fix=FIX_CONFIG, ssh_key=NO_KEY)
    try:
        import lightkube  # noqa: F401 - the SDK, or its extra's fix
    except ModuleNotFoundError:
        return ProviderCheck("kubernetes", False, "lightkube is not installed",
                             fix="pip install 'gtrain[kubernetes]'", credentials=where, ssh_key=NO_KEY)
    from lightkube.resources.core_v1 import Namespace, Node

    from gtrain.providers.kubernetes.api import call, client

    namespace = os.environ.get("GTRAIN_KUBE_NAMESPACE") or "default"
    try:
        c = client(None, namespace)
        ns = call(c.get, f"get namespace {namespace}", namespace, Namespace, name=namespace)
    except GtrainError as e:
        revoked = "refused the kubeconfig's credentials" in e.message
        return ProviderCheck("kubernetes", False, e.message.splitlines()[0],
                             fix=("refresh the kubeconfig's token (its exec plugin's login), then gtrain check "
                                  "kubernetes") if revoked else (e.hint or FIX_CONFIG),
                             credentials=where, ssh_key=NO_KEY)
    phase = getattr(getattr(ns, "status", None), "phase", None) or "found"
    call_line = f"get namespace {namespace}: {phase}"
    try:
        nodes = list(call(c.list, "list nodes", namespace, Node))
        gpus = sum(int((getattr(n.status, "allocatable", None) or {}).get("nvidia.com/gpu", "0") or 0)
                   for n in nodes if n.status is not None)
        quota = f"{gpus} GPUs allocatable on {len(nodes)} nodes"
    except (GtrainError, ValueError) as e:
        quota = f"cannot tell ({str(e).splitlines()[0][:80]})"
    return ProviderCheck("kubernetes", True, f"namespace {namespace} readable", credentials=where, call=call_line,
                         quota=quota, ssh_key=NO_KEY)
