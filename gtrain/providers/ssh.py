"""The ``ssh`` provider: machines a team already has, reached over plain SSH (no Docker, no k3s).

``up`` checks every host (reachable, python3, torch importable, GPUs, free disk) before it creates
anything, pins each host key (from ``ssh.host_keys`` or trust-on-first-use, printing the fingerprint),
then makes ``~/gtrain/<cluster>/`` on each host. ``down`` stops gtrain's jobs and removes gtrain's files;
the machines stay. paramiko is imported only through :mod:`gtrain.remote.ssh`, and only when used.
"""

from __future__ import annotations

import getpass
import os
import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gtrain.errors import ConfigError, GtrainError, RemoteError
from gtrain.providers.base import IntervalCost, NodeStatus, Plan, Provider, ProviderCheck
from gtrain.remote.fanout import parallel
from gtrain.remote.nodeside import ROOT_MARKER

if TYPE_CHECKING:
    from gtrain.remote.base import Runner
    from gtrain.remote.ssh import SSHRunner, SSHTarget
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster, CostInterval
    from gtrain.state.nodes import NodeRecord

#: a user or host name: letters, digits, `.`, `_`, `-`, not starting with `-` (ssh would read it as an option)
NAME = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
_NAME_RE = re.compile(rf"^{NAME}$")
_HOST_RE = re.compile(rf"^(?:(?P<user>{NAME})@)?(?P<host>\[[0-9a-fA-F:.]+\]|{NAME})(?::(?P<port>\d+))?$")


def not_bool(v: Any) -> Any:
    """YAML's `true` is not port 1 (pydantic would take it as one)."""
    if isinstance(v, bool):
        raise ValueError("is a boolean, not a number")
    return v


def one_line(v: str | None) -> str | None:
    """A path or command that goes into a shell line: no NUL, newline or other control character."""
    if v is not None and any(c < " " or c == "\x7f" for c in v):
        raise ValueError("holds a control character (a newline, NUL, ...)")
    return v


def check_jump(v: str | None) -> str | None:
    """``[user@]host[:port]``: what ssh -J takes, never an option."""
    if v is not None and not _HOST_RE.match(v):
        raise ValueError("is not [USER@]HOST[:PORT] (letters, digits, '.', '_', '-', not starting with '-')")
    return v


def check_name(v: str | None) -> str | None:
    """A user or host name ssh cannot take for an option or a second line."""
    if v is not None and not (_NAME_RE.match(v) or re.match(r"^[0-9a-fA-F:.]+$", v) and ":" in v):
        raise ValueError("must be letters, digits, '.', '_' and '-', not starting with '-'")
    return v


class HostEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str = Field(..., min_length=1)
    user: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    identity_file: str | None = None
    address: str | None = Field(None, description="the address the other nodes reach this one on")

    _names = field_validator("host", "user", "address")(check_name)
    _port = field_validator("port", mode="before")(not_bool)


class SSHSection(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str = Field(default_factory=getpass.getuser)
    identity_file: str | None = None
    port: int = Field(22, ge=1, le=65535)
    hosts: list[HostEntry] = Field(..., min_length=1)
    proxy_jump: str | None = None
    proxy_command: str | None = None
    host_keys: dict[str, str] = Field(default_factory=dict)
    python: str = "python3"
    root: str | None = Field(None, description="gtrain's directory on each host (default ~/gtrain/<cluster>)")
    check_torch: bool = True

    @field_validator("hosts", mode="before")
    @classmethod
    def _hosts(cls, v: Any) -> Any:
        if not isinstance(v, list):
            return v
        out: list[Any] = []
        for item in v:
            if isinstance(item, str):
                m = _HOST_RE.match(item.strip())
                if not m:
                    raise ValueError(f"{item!r} is not HOST, HOST:PORT or USER@HOST:PORT")
                out.append({"host": m.group("host").strip("[]"), "user": m.group("user"),
                            "port": int(m.group("port")) if m.group("port") else None})
            else:
                out.append(item)
        return out

    _user = field_validator("user")(check_name)
    _lines = field_validator("identity_file", "proxy_command", "python")(one_line)
    _jump = field_validator("proxy_jump")(check_jump)
    _port = field_validator("port", mode="before")(not_bool)
    @field_validator("root")
    @classmethod
    def _root(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = v.replace("\\", "/").split("/")
        if "\x00" in v or not v.strip() or ".." in parts:
            raise ValueError(f"{v!r} is not a folder path gtrain can own (no '..', not empty)")
        if v.rstrip("/") in ("", "~") or (v.startswith("~") and "/" not in v.rstrip("/")):
            raise ValueError(f"{v!r} is / or a home folder; `down` removes the root, so give a folder of "
                             "its own, e.g. ~/gtrain/NAME")
        return v

    @field_validator("proxy_command")
    @classmethod
    def _one_proxy(cls, v: str | None, info: Any) -> str | None:
        if v and info.data.get("proxy_jump"):
            raise ValueError("give proxy_jump or proxy_command, not both")
        return v


def parse_section(spec: ClusterSpec) -> SSHSection:
    from gtrain.spec import translate_validation_error

    if spec.ssh is None:
        raise ConfigError("provider ssh needs an `ssh:` section with `hosts:`", field="ssh",
                          hint="ssh: {user: ubuntu, identity_file: ~/.ssh/id_ed25519, hosts: [10.0.0.5, 10.0.0.6]}")
    try:
        section = SSHSection.model_validate(spec.ssh)
    except ValidationError as e:
        err = translate_validation_error(e, SSHSection)
        msg = err.message.replace("invalid spec: ", "invalid spec: ssh.").replace("; ", "; ssh.")
        raise ConfigError(msg, hint=err.hint, field=f"ssh.{err.field}") from None
    if spec.num_nodes > len(section.hosts):
        raise ConfigError(
            f"num_nodes: {spec.num_nodes}, but ssh.hosts lists {len(section.hosts)} host(s)",
            hint="list more hosts, or lower num_nodes (the first num_nodes hosts are used)", field="num_nodes",
        )
    return section


def _volumes(spec: ClusterSpec, runners: list[Any], labels: list[str], roots: list[str]) -> None:
    from gtrain.spec.volumes import path_refusal, path_script, root_refusal

    for link in (False, True):
        for r, label, root in zip(runners, labels, roots, strict=True):
            if err := root_refusal(spec, root, label):
                raise err
            res = r.run(path_script(spec, link=link), timeout=60, check=False)
            if err := path_refusal(spec, label, res.stdout):
                raise err
            if res.rc != 0:
                raise ConfigError(f"volumes: could not link the mounts on {label}: {res.stderr.strip()[-300:]}",
                                  field="volumes")


def target_for(section: SSHSection, entry: HostEntry) -> SSHTarget:
    from gtrain.remote.ssh import SSHTarget

    ident = entry.identity_file or section.identity_file
    return SSHTarget(
        host=entry.host, port=entry.port or section.port, user=entry.user or section.user,
        identity_file=os.path.expanduser(ident) if ident else None,
        proxy_jump=section.proxy_jump, proxy_command=section.proxy_command,
    )


class SSHProvider(Provider):
    name = "ssh"

    def plan(self, spec: ClusterSpec) -> Plan:
        from gtrain.spec.volumes import path_notes

        section = parse_section(spec)
        hosts = [f"{(h.user or section.user)}@{h.host}:{h.port or section.port}" for h in section.hosts]
        return Plan(
            provider="ssh", num_nodes=spec.num_nodes, instance_type="ssh", market="owned",
            gpu_name=spec.resources.gpu_name, gpus_per_node=spec.resources.gpus_per_node, price_per_hour=0.0,
            max_hours=spec.policies.max_hours,
            notes=[f"hosts: {', '.join(hosts[:spec.num_nodes])}", "machines you already have: no charge from gtrain",
                   *path_notes(spec)],
        )

    def provision(self, spec: ClusterSpec, cluster: Cluster, plan: Plan) -> None:
        from gtrain.remote.ssh import SSHRunner, pin_host_key, pinned_keys
        from gtrain.remote.ssh.node import UP_NODE_RETRY_S
        from gtrain.state.nodes import NodeRecord

        section = parse_section(spec)
        entries = section.hosts[: spec.num_nodes]
        targets = [target_for(section, e) for e in entries]
        for key, line in section.host_keys.items():
            host, port = split_host_port(key, section.port)
            pin_host_key(host, port, line)

        def on_new(host: str, port: int, keytype: str, fp: str) -> None:
            self.report.info(f"trusting {host}:{port} on first use: {keytype} {fp}")

        root = section.root or f"~/gtrain/{cluster.name}"
        runners = [SSHRunner(t, cluster=cluster.name, root="/", label=f"node {i} ({t.display})",
                             python=section.python, tofu=True, on_new_host_key=on_new,
                             connect_retry_s=UP_NODE_RETRY_S)  # hosts that are up: no boot to wait for
                   for i, t in enumerate(targets)]

        def check(i: int) -> dict[str, Any]:
            r = runners[i]
            try:
                res = r.run_python(_probe_source(), ["probe", root, "1" if section.check_torch else "0"],
                                   timeout=180, check=False)
            except RemoteError as e:
                return {"error": e.message}
            if res.rc == 127:
                return {"error": f"{section.python} not found on the host (set ssh.python)"}
            if res.rc != 0:
                return {"error": f"{section.python} failed (exit {res.rc}): {res.stderr.strip()[-300:]}"}
            import json

            info: dict[str, Any] = json.loads(res.stdout)
            if info.get("root_error"):
                info["error"] = f"ssh.root: {info['root_error']} (give ssh.root a new or empty folder for gtrain)"
            elif "torch_error" in info:
                info["error"] = (f"torch is not importable with {section.python}: {info['torch_error']} "
                                 "(install it there, or set ssh.python / ssh.check_torch: false)")
            return info

        self.report.info(f"checking {len(targets)} host(s)")
        infos = parallel(check, list(range(len(targets))))
        bad = [(i, info["error"]) for i, info in enumerate(infos) if "error" in info]
        for i, info in enumerate(infos):
            if "error" not in info:
                self.report.node(i, f"{targets[i].display}: {info['hostname']}, python {info['python']}, "
                                    f"torch {info.get('torch', '-')}, {info['gpus']} GPU(s), {info['free_gb']} GB free")
        if bad:
            lines = "; ".join(f"node {i} ({targets[i].display}): {why}" for i, why in bad)
            raise RemoteError(f"{len(bad)} of {len(targets)} host(s) failed the checks, nothing was created: {lines}",
                              hint="fix the host(s) and run `gtrain up` again")
        from gtrain.spec.volumes import path_volumes

        if path_volumes(spec):  # host folders: every node checked (nothing made on a refusal), then linked
            _volumes(spec, runners, [f"node {i} ({t.display})" for i, t in enumerate(targets)],
                     [str(info["root"]) for info in infos])
        rids = [self.store.record_resource(cluster.id, "remote-dir", f"{t.display}:{info['root']}")
                for t, info in zip(targets, infos, strict=True)]

        def make_root(i: int) -> None:  # its folders and marker in one command, every host at once
            node_root = str(infos[i]["root"])
            runners[i].write_files({f"{node_root}/{ROOT_MARKER}": f"{cluster.name}\n".encode()}, 0o600,
                                   folders=[f"{node_root}/workdir", f"{node_root}/jobs"])
            self.store.mark_resource(rids[i], "created")

        parallel(make_root, list(range(len(targets))))
        addresses = [entry.address or _reachable(info.get("ssh_server_addr"), t.host)
                     for t, info, entry in zip(targets, infos, entries, strict=True)]
        start_pulse(cluster, runners, [str(info["root"]) for info in infos], addresses, self.report)
        for i, (t, info, _entry) in enumerate(zip(targets, infos, entries, strict=True)):
            node_root = str(info["root"])
            address = addresses[i]
            self.store.put_node(cluster.id, NodeRecord(
                rank=i, status="up", address=address, instance_id=t.display, ssh=t, root=node_root,
                python=section.python, extra={"hostname": info["hostname"], "gpus": info["gpus"],
                                              "host_keys": [k for k, _ in pinned_keys(t.host, t.port)]}))
        from gtrain.remote.sshconfig import write_ssh_config

        path = write_ssh_config(self.store)
        self.report.info(f"ssh config: {path} (add `Include {path}` to ~/.ssh/config for `ssh {cluster.name}-0`)")

    def describe(self, cluster: Cluster) -> list[NodeStatus]:
        """Each host reachable or not: a host that node 0's heartbeat aggregate heard within two of its beats
        (gtrain.remote.nodebeat.on_time; its newest job not over: gtrain.jobs.nodescript.beats) is reachable
        without asking it; every other host runs ``true`` over SSH. So a poll of a running job costs one
        request, not one per host, and a host that went away is asked (and found unreachable) two beats on."""
        runners = self.runners(cluster)
        fresh = self._beating(cluster, runners)

        def one(i: int) -> NodeStatus:
            if i in fresh:
                return NodeStatus(i, "running", runners[i].address, "heartbeat")
            try:
                runners[i].run("true", timeout=30)
                return NodeStatus(i, "running", runners[i].address)
            except GtrainError as e:
                return NodeStatus(i, "unreachable", runners[i].address, e.message)

        return parallel(one, list(range(len(runners))))

    def _beating(self, cluster: Cluster, runners: list[Runner]) -> set[int]:
        """The hosts node 0 heard within two beats: the job's beats while a job runs, else the hosts' own
        (:func:`start_pulse`: an idle cluster's `status` asks node 0 alone)."""
        from gtrain.jobs.nodescript import beats
        from gtrain.remote.nodebeat import on_time, stale_s
        from gtrain.state import TERMINAL_JOB

        if len(runners) != cluster.num_nodes or not runners:
            return set()
        job = self.store.latest_job(cluster.id)
        got = beats(runners, job) if job is not None and job.status not in TERMINAL_JOB else None
        if got is None:
            got = read_pulse(cluster, runners) or {}
        return {i for i, b in got.items() if on_time(b) and float(b["age"]) <= stale_s()}

    def terminate(self, cluster: Cluster) -> None:
        nodes = {n.rank: n for n in self.store.node_records(cluster.id)}
        runners = {i: self._runner(cluster, n) for i, n in nodes.items()}
        live = self.store.resources(cluster.id, live_only=True)

        def remove(res: Any) -> None:
            node = next((n for n in nodes.values() if res.ref == f"{n.instance_id}:{n.root}"), None)
            if node is None:
                self.store.mark_resource(res.id, "deleted")
                return
            try:
                import shlex

                from gtrain.containers.runtime import cluster_cleanup_command  # job.image: by label
                from gtrain.remote.base import nodeside_source

                r = runners[node.rank]  # the containers, then gtrain's root: one command
                r.run(f"{{ {cluster_cleanup_command(cluster.name)}; }} </dev/null >/dev/null 2>&1; "
                      + shlex.join([r.python, "-", "remove_tree", str(node.root)]),
                      stdin=nodeside_source().encode(), timeout=240)
                self.store.mark_resource(res.id, "deleted")
            except GtrainError as e:
                self.store.mark_resource(res.id, "unreachable")
                self.report.warn(f"node {node.rank}: could not remove {node.root}: {e.message} "
                                 "(the machine is yours; nothing there costs gtrain money)")

        parallel(remove, live)
        from gtrain.remote.sshconfig import write_ssh_config

        write_ssh_config(self.store, exclude=cluster.id)

    def _runner(self, cluster: Cluster, node: NodeRecord) -> SSHRunner:
        from gtrain.remote.ssh import runner_from_node

        return runner_from_node(node, cluster.name)

    def runners(self, cluster: Cluster) -> list[Runner]:
        return [self._runner(cluster, n) for n in self.store.node_records(cluster.id)]

    def price(self, cluster: Cluster, interval: CostInterval) -> IntervalCost:
        return IntervalCost(0.0, note="your own machines: no charge from gtrain")


def start_pulse(cluster: Cluster, runners: list[Any], roots: list[str], addresses: list[str],
                report: Any) -> None:
    """Each host's own beat (gtrain.remote.nodebeat.pulse), job or no job: node 0 first (it picks a free UDP
    port and gathers), then the others at once, each sending to node 0's cluster address. A host whose beat
    does not start, or that node 0 never hears, is asked itself by `status`, as before (docs/scale.md)."""
    import json

    from gtrain.jobs.templating import nodebeat_source
    from gtrain.remote.nodebeat import NODE_DIR

    key, n, every = f"node:{cluster.id}", str(len(runners)), os.environ.get("GTRAIN_HEARTBEAT_S") or "5"

    def one(i: int, port: str) -> dict[str, Any] | None:
        try:
            res = runners[i].run_python(nodebeat_source(), ["pulse", f"{roots[i]}/{NODE_DIR}", key, str(i), n,
                                                            addresses[0], port, every], timeout=60)
            got = json.loads(res.stdout)
            return got if isinstance(got, dict) else None
        except (GtrainError, ValueError) as e:
            report.warn(f"node {i}: its heartbeat did not start ({getattr(e, 'message', e)}); `status` asks it "
                        "directly")
            return None

    first = one(0, "0")
    if first is not None and len(runners) > 1:
        parallel(lambda i: one(i, str(first["port"])), list(range(1, len(runners))))


def read_pulse(cluster: Cluster, runners: list[Any]) -> dict[int, dict[str, Any]] | None:
    """Each host's word from node 0's gathering of the hosts' own beats (gtrain.remote.nodebeat.derive), in one
    request to node 0; None: none to read (an older cluster, node 0 not answering, its gatherer gone)."""
    from gtrain.jobs.nodescript import direct_only, read_beats
    from gtrain.remote.nodebeat import NODE_DIR, derive, stale_s

    if direct_only():  # a decision's read (gtrain.runs.recovery.observe): every host asked itself
        return None
    answer = read_beats(runners[0], "", folder=f"{runners[0].root}/{NODE_DIR}")
    return derive(answer, job_id=f"node:{cluster.id}", num_nodes=len(runners), stale=stale_s())


def split_host_port(key: str, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 address (``fd00::7``)."""
    m = re.match(r"^\[(?P<h>[^\]]+)\](?::(?P<p>\d+))?$", key)
    if m:
        return m.group("h"), int(m.group("p") or default_port)
    if key.count(":") == 1:
        host, _, port = key.partition(":")
        if port.isdigit():
            return host, int(port)
    return key, default_port


def _reachable(server_addr: object, host: str) -> str:
    """The address the other nodes should use: the one our SSH connection arrived on, unless that is
    loopback while the host was named otherwise (a tunnel), in which case the name we were given."""
    if isinstance(server_addr, str) and server_addr:
        if not server_addr.startswith("127.") and server_addr != "::1":
            return server_addr
        if host in ("localhost", "127.0.0.1", "::1") or host.startswith("127."):
            return server_addr
    return host


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)


def _probe_source() -> str:
    from gtrain.remote.base import nodeside_source

    return nodeside_source()


def check(timeout: float) -> ProviderCheck:
    """``gtrain check ssh``: machines a spec lists (``ssh.hosts``), so here only what reaching them needs of this
    machine: a private key in ``~/.ssh`` or an agent (a spec may name ``identity_file`` instead); read-only."""
    from pathlib import Path

    home = Path("~/.ssh").expanduser()
    keys = [str(p) for n in ("id_ed25519", "id_ecdsa", "id_rsa") if (p := home / n).is_file()]
    agent = os.environ.get("SSH_AUTH_SOCK")
    found = ", ".join(keys + ([f"ssh-agent ({agent})"] if agent else []))
    needs = "a spec's ssh.hosts (each checked by `gtrain up`: reachable, python3, torch, GPUs, disk)"
    if not found:
        return ProviderCheck("ssh", False, f"no SSH key in {home} and no ssh-agent; it needs one, and {needs}",
                             fix="ssh-keygen -t ed25519  (then ssh-copy-id user@host for each host)",
                             ssh_key="none found")
    return ProviderCheck("ssh", True, f"usable with {needs}", credentials=found, ssh_key=found)
