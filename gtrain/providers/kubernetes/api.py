"""The lightkube client (imported here only, lazily) and the API server's errors as gtrain's: 401/403 name the
verb and resource denied, 404 the namespace, 409 the objects that exist, 422 the field the API rejected, a
quota its resource -- each a ConfigError (exit 2) where the spec or the credentials are what is wrong."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from gtrain.errors import ConfigError, ProviderError

T = TypeVar("T")


def client(context: str | None, namespace: str) -> Any:
    """A lightkube Client: the in-cluster config, else KUBECONFIG (or ~/.kube/config) with ``context`` (else its
    current context), as ``KubeConfig.from_env`` picks them; the file is read by the spec's bounded YAML loader, so
    a binary, hostile or misshapen kubeconfig is one ConfigError naming it (exit 2), never a crash."""
    from lightkube import Client, KubeConfig
    from lightkube.core.exceptions import ConfigError as KubeConfigError

    fld = "kubernetes.context"
    try:
        config = KubeConfig.from_service_account()
        where = "the in-cluster config"
    except (KubeConfigError, OSError):
        config, where = _kubeconfig_file()
    if context is None and config.current_context is None:
        raise ConfigError(f"{where} sets no current-context and kubernetes.context is not set", field=fld,
                          hint="set kubernetes.context in the spec, or `kubectl config use-context NAME` "
                               "(`kubectl config get-contexts` lists them)")
    try:
        single = config.get(context_name=context)
    except (KubeConfigError, KeyError) as e:
        why = f"context {context!r} not found" if isinstance(e, KubeConfigError) else f"it names {e} but lacks it"
        raise ConfigError(f"{fld}: {context or config.current_context!r} — no usable context in {where}: {why}",
                          hint="set KUBECONFIG or kubernetes.context (`kubectl config get-contexts`)",
                          field=fld) from None
    return Client(single, namespace=namespace, field_manager="gtrain")


def _kubeconfig_file() -> tuple[Any, str]:
    """``KUBECONFIG`` (or ~/.kube/config) as a lightkube ``KubeConfig``, and how to name it in a message."""
    import os
    from pathlib import Path

    from lightkube import KubeConfig

    from gtrain.spec.loader import MAX_BYTES
    from gtrain.spec.loader import load as load_yaml

    raw_name = os.environ.get("KUBECONFIG") or "~/.kube/config"
    fld = "KUBECONFIG" if os.environ.get("KUBECONFIG") else "kubernetes.context"
    path = Path(raw_name).expanduser()
    where = f"kubeconfig {str(path)!r}"
    fix = "point KUBECONFIG at a kubeconfig file (`kubectl config view` shows the one in use)"
    if not path.is_file():
        raise ConfigError(f"{where} does not exist (and this is not a pod with a service account)", field=fld,
                          hint=fix)
    try:
        with path.open("rb") as f:
            text = f.read(MAX_BYTES + 1).decode("utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {where}: {e.strerror or e}", field=fld, hint=fix) from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where} is not UTF-8 text (byte {e.start + 1}): not a kubeconfig", field=fld,
                          hint=fix) from None
    try:
        doc = load_yaml(text, where, merge=True)  # kubectl takes merge keys in a kubeconfig
    except ConfigError as e:  # nested too deep, malformed, oversized: the loader's message names the file
        raise ConfigError(e.message, field=fld, hint=fix) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("contexts", []), list) \
            or not isinstance(doc.get("clusters", []), list):
        shape = type(doc).__name__ if not isinstance(doc, dict) else "a mapping whose contexts/clusters are not lists"
        raise ConfigError(f"{where} is {shape}, not a kubeconfig (a mapping with clusters, contexts, users)",
                          field=fld, hint=fix)
    try:
        return KubeConfig.from_dict({"clusters": [], "contexts": [], **doc}, fname=path), where
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise ConfigError(f"{where} is not a well-formed kubeconfig ({type(e).__name__}: {e})", field=fld,
                          hint=fix) from None


def translate(exc: BaseException, doing: str, namespace: str) -> BaseException:
    """The gtrain error for a client exception raised while ``doing`` (e.g. "create Job big-1")."""
    import httpx2
    from lightkube import ApiError

    if isinstance(exc, ApiError):
        st = exc.status
        code, reason, msg = st.code or 0, st.reason or "", st.message or str(exc)
        if code == 401:
            return ConfigError(f"kubernetes.context: {doing}: the API server refused the kubeconfig's credentials "
                               "(401 Unauthorized)",
                               hint="refresh the kubeconfig's token (or its exec plugin's login)",
                               field="kubernetes.context")
        if code == 403 and "exceeded quota" in msg:
            return ConfigError(f"kubernetes: {doing}: {msg}", field="resources.accelerators",
                               hint=f"the namespace {namespace!r} has a ResourceQuota: ask for less, or for more quota")
        if code == 403:
            return ConfigError(f"kubernetes.namespace: {doing}: {msg} (403 Forbidden)", field="kubernetes.namespace",
                               hint="grant the role create/get/list/watch/delete on jobs, pods, pods/log, services "
                                    f"and configmaps in {namespace!r}, or pick another kubernetes.namespace")
        if code == 404 and st.details is not None and st.details.kind == "namespaces":
            return ConfigError(f"kubernetes.namespace: {namespace!r} does not exist ({doing})",
                               hint="`kubectl create namespace " + namespace + "`, or another kubernetes.namespace",
                               field="kubernetes.namespace")
        if code == 409:
            return ConfigError(f"kubernetes: {doing}: {msg} (409 {reason})", field="name",
                               hint="objects of that name exist already: `gtrain down` the cluster, or another name")
        if code == 422:
            causes = [f"{c.field}: {c.message}" for c in (st.details.causes or [])] if st.details else []
            field = (st.details.causes[0].field or "") if st.details and st.details.causes else ""
            return ConfigError(f"kubernetes: {doing}: the API rejected {'; '.join(causes) or msg} (422 Invalid)",
                               hint="see the kubernetes: section and job.image", field=f"kubernetes ({field})")
        return ProviderError(f"kubernetes: {doing}: {msg} ({code} {reason})")
    if isinstance(exc, httpx2.HTTPError):
        return ProviderError(f"kubernetes: {doing}: cannot reach the API server: {exc}",
                             hint="check the kubeconfig's server address and your network")
    from httpx2.websockets import WebSocketNetworkError

    if isinstance(exc, WebSocketNetworkError) or type(exc).__module__.split(".")[0] in ("wsproto", "h11"):
        # an exec stream cut (pods/exec), e.g. while its pod ends: the socket's error, or the protocol's state
        # (wsproto's "cannot be sent in state REMOTE_CLOSING" when the API server closed it first)
        return ProviderError(f"kubernetes: {doing}: the exec stream broke ({type(exc).__name__})",
                             hint="run it again; `gtrain status` says whether the pod still runs")
    return exc


@contextmanager
def edge(doing: str, namespace: str) -> Iterator[None]:
    """Run a block of client calls, turning their errors into gtrain's."""
    try:
        yield
    except Exception as e:  # noqa: BLE001  (each is translated or re-raised as it was)
        raise translate(e, doing, namespace) from None


def call(fn: Callable[..., T], doing: str, namespace: str, *a: Any, **kw: Any) -> T:
    with edge(doing, namespace):
        return fn(*a, **kw)


def is_not_found(exc: BaseException) -> bool:
    from lightkube import ApiError

    return isinstance(exc, ApiError) and exc.status.code == 404
