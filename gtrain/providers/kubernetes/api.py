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
    """A lightkube Client: KUBECONFIG (or ~/.kube/config) with ``context``, else the in-cluster config."""
    from lightkube import Client, KubeConfig
    from lightkube.core.exceptions import ConfigError as KubeConfigError

    try:
        config = KubeConfig.from_env().get(context_name=context) if context else KubeConfig.from_env()
    except (KubeConfigError, KeyError, OSError) as e:
        raise ConfigError(f"kubernetes.context: {context or '(current)'!r} — no usable kubeconfig: {e}",
                          hint="set KUBECONFIG or kubernetes.context (`kubectl config get-contexts`)",
                          field="kubernetes.context") from None
    return Client(config, namespace=namespace, field_manager="gtrain")


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

    if isinstance(exc, WebSocketNetworkError):  # an exec stream cut (pods/exec), e.g. while its pod ends
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
