"""The spec's ``volumes:`` on lambda (docs/volumes.md): ``type: filesystem``, a Lambda Cloud persistent file system
named ``gtrain-<NAME>`` (Lambda keeps no tags: the name is the tag, as for gtrain's instances), made once by ``up``
(or ``gtrain volume create``) in the cluster's region, passed to every node's launch (``file_system_names``),
left by ``down``, deleted only by ``gtrain volume delete``. A part of
:class:`gtrain.providers.lambda_cloud.provider.LambdaProvider`.

- Regional: a file system attaches only to instances of its region. An existing one pins the cluster to its
  region (no failover elsewhere); one in a region the spec rules out is refused (exit 2). A new one is made in
  the first region of the plan, and the cluster stays there.
- One per instance: Lambda attaches at most one file system at launch; ``volumes:`` plus
  ``lambda.file_system_names`` may name one (exit 2 otherwise).
- Mounted by Lambda at its ``mount_point`` (``/lambda/nfs/<name>``, read-write on every node); ``mount`` becomes a
  link to it on each node once the node answers over SSH (as a ``type: path`` volume's). ``read_only`` is
  refused: Lambda mounts it read-write.
- Held: a file system mounted by a live instance of another gtrain cluster is refused to a second cluster.
- No size: a file system grows with what it holds; its size is ``bytes_used`` (Lambda updates it every few hours)
  in GiB, rounded up, and its charge $0.20 per GiB used per month
  (https://docs.lambda.ai/public-cloud/billing/#filesystems: "Filesystems are billed per GiB used per month in
  one-hour increments", the rate the page gives; https://lambda.ai/pricing). ``size_gb`` is ignored (a note).
- A file system named exactly ``NAME`` that gtrain did not make is used as it is, never deleted by gtrain.

API (1.10.0; https://docs.lambda.ai/api/cloud, OpenAPI https://cloud.lambda.ai/api/v1/docs): ``GET /file-systems``
(``id``, ``name``, ``mount_point``, ``created``, ``created_by``, ``is_in_use``, ``region``, ``bytes_used``),
``POST /filesystems`` ``{"name", "region"}`` (name ``^[a-zA-Z]+[0-9a-zA-Z-]*$``, 1-60), ``DELETE
/filesystems/{id}`` (400 ``filesystems/filesystem-in-use`` while mounted).
"""

from __future__ import annotations

import math
import shlex
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError, GtrainError
from gtrain.providers.cloud.errors import code_of
from gtrain.providers.lambda_cloud.teardown import owner_of_instance
from gtrain.spec.volumes import VolumeInfo, type_of

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.lambda_cloud.api import LambdaAPI
    from gtrain.spec import ClusterSpec
    from gtrain.spec.volumes import Volume
    from gtrain.state import Cluster, StateStore

PREFIX = "gtrain-"
#: $ per GiB used per month (https://docs.lambda.ai/public-cloud/billing/#filesystems)
USD_PER_GB_MONTH = 0.20
IN_USE = "filesystems/filesystem-in-use"
LIVE = ("booting", "active", "unhealthy")


def fs_name(name: str) -> str:
    return PREFIX + name


def fs_volumes(spec: ClusterSpec) -> list[tuple[int, Volume]]:
    return [(i, v) for i, v in enumerate(spec.volumes or []) if type_of(spec, v) == "filesystem"]


def size_gib(fs: dict[str, Any]) -> int | None:
    used = fs.get("bytes_used")
    return math.ceil(int(used) / 2**30) if isinstance(used, int) else None


def check_spec(spec: ClusterSpec, named: list[str]) -> None:
    """Before anything is made (one line, exit 2): at most one file system, none read-only."""
    vols = fs_volumes(spec)
    for i, vol in vols:
        if vol.read_only:
            raise ConfigError(f"volumes[{i}].read_only: Lambda mounts a file system read-write on every node",
                              hint="drop read_only (or set the folders' permissions in the job)",
                              field=f"volumes[{i}].read_only")
    if len(vols) + len(named) > 1:
        i = vols[-1][0]
        raise ConfigError(f"volumes[{i}]: Lambda attaches one file system to an instance; the spec names "
                          f"{len(vols) + len(named)} (volumes: and lambda.file_system_names)",
                          hint="keep one (folders inside one file system hold several data sets)",
                          field=f"volumes[{i}]")


def plan_notes(spec: ClusterSpec, region: str | None) -> list[str]:
    vols = fs_volumes(spec)
    if not vols:
        return []
    notes = ["volumes: Lambda file system " + ", ".join(f"{fs_name(v.name)} at {v.mount} (a link to "
                                                          f"/lambda/nfs/{fs_name(v.name)})" for _, v in vols)
             + f"; made once, kept by `down` (${USD_PER_GB_MONTH:g} per GiB used per month) until "
               "`gtrain volume delete NAME`",
             f"volumes pin the cluster to one region: the file system's, else {region or 'the first with capacity'} "
             "(no failover to other regions)"]
    if any(v.size_gb is not None for _, v in vols):
        notes.append("volumes: size_gb does not apply on lambda (a file system grows with what it holds)")
    return notes


def link_script(records: list[dict[str, Any]], wait_s: int = 120) -> str:
    """bash for each node: wait for Lambda's mount of each file system, make ``mount`` a link to it (a link
    already there to it is fine; anything else there is refused: ``TAKEN``)."""
    lines = ["set -u", 'SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo', "rc=0"]
    for r in records:
        src, mnt = shlex.quote(str(r["mount_point"])), shlex.quote(str(r["mount"]))
        lines += [
            f"for _ in $(seq 1 {wait_s}); do [ -d {src} ] && break; sleep 1; done",
            f'if [ ! -d {src} ]; then echo "MISSING {r["name"]}"; rc=3',
            f'elif [ -L {mnt} ] && [ "$(readlink {mnt})" = {src} ]; then :',
            f'elif [ -e {mnt} ] || [ -L {mnt} ]; then echo "TAKEN {r["name"]}"; rc=3',
            f'else $SUDO mkdir -p "$(dirname {mnt})" && $SUDO ln -s {src} {mnt} || rc=3; fi',
        ]
    return "\n".join([*lines, "exit $rc"]) + "\n"


class LambdaVolumes:
    """Finding, making and deleting the spec's file systems; ``gtrain volume`` for lambda."""

    def __init__(self, api: LambdaAPI, store: StateStore, report: Reporter) -> None:
        self.api, self.store, self.report = api, store, report

    # ---- finding ----

    def find(self, name: str, systems: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
        """The file system of volume ``name``: gtrain's (``gtrain-NAME``), else one named exactly ``NAME``."""
        systems = self.api.file_systems() if systems is None else systems
        by = {str(f.get("name")): f for f in systems}
        return by.get(fs_name(name)) or by.get(name)

    def holders(self, fs: dict[str, Any], instances: list[dict[str, Any]]) -> dict[str, str]:
        """cluster id -> name of the gtrain clusters whose live instances mount ``fs``."""
        out: dict[str, str] = {}
        for i in instances:
            own = owner_of_instance(i.get("name"))
            if own and i.get("status") in LIVE and fs.get("name") in (i.get("file_system_names") or []):
                c = self.store.get_cluster_by_id(own[0])
                out[own[0]] = c.name if c is not None else own[0]
        return out

    def info(self, fs: dict[str, Any], instances: list[dict[str, Any]]) -> VolumeInfo:
        name = str(fs.get("name") or "")
        held = self.holders(fs, instances)
        return VolumeInfo(name=name[len(PREFIX):] if name.startswith(PREFIX) else name, provider="lambda",
                          type="filesystem", size_gb=size_gib(fs), region=(fs.get("region") or {}).get("name"),
                          id=fs.get("id"), state="in-use" if fs.get("is_in_use") else "available",
                          attached_to=", ".join(sorted(held.values())) or None, usd_per_gb_month=USD_PER_GB_MONTH,
                          created=fs.get("created"), extra={"file_system": name, "mount_point": fs.get("mount_point"),
                                                            "bytes_used": fs.get("bytes_used")})

    def list_all(self, regions: list[str] | None) -> list[VolumeInfo]:
        instances = self.api.instances()
        out = [self.info(f, instances) for f in self.api.file_systems() if str(f.get("name") or "").startswith(PREFIX)
               and (not regions or (f.get("region") or {}).get("name") in regions)]
        return sorted(out, key=lambda i: (i.name, i.region or ""))

    # ---- up ----

    def prepare(self, spec: ClusterSpec, cluster: Cluster, regions: list[str]) -> str | None:
        """Before anything is made: refuse a file system outside ``regions`` or held by another live cluster;
        the region the existing ones pin (None: none exists yet)."""
        vols = fs_volumes(spec)
        if not vols:
            return None
        systems, instances = self.api.file_systems(), self.api.instances()
        pinned: str | None = None
        for i, vol in vols:
            fs = self.find(vol.name, systems)
            if fs is None:
                continue
            fld = f"volumes[{i}].name"
            region = str((fs.get("region") or {}).get("name") or "")
            if regions and region not in regions:
                raise ConfigError(f"{fld}: file system {fs['name']} is in {region}, the cluster goes to "
                                  f"{', '.join(regions)}: a Lambda file system attaches only in its own region",
                                  hint=f"set resources.region: {region}, or `gtrain volume delete {vol.name}` to "
                                       "start afresh", field=fld)
            held = {cid: n for cid, n in self.holders(fs, instances).items() if cid != cluster.id}
            if held:
                who = ", ".join(sorted(held.values()))
                raise ConfigError(f"{fld}: file system {fs['name']} is mounted by cluster {who} (read-write: one "
                                  "cluster at a time)", hint=f"`gtrain down {who}` first (the file system stays), "
                                                             "or use another volume name", field=fld)
            pinned = region
        return pinned

    def ensure(self, spec: ClusterSpec, region: str, only: str | None = None) -> list[dict[str, Any]]:
        """Each file system of the spec, made in ``region`` when missing; the records ``up`` keeps with the
        cluster (the cost report's standing charge) and hands to the launches."""
        systems = self.api.file_systems()
        out = []
        for _i, vol in fs_volumes(spec):
            if only is not None and vol.name != only:
                continue
            fs = self.find(vol.name, systems)
            if fs is None:
                self.report.info(f"{region}: creating Lambda file system {fs_name(vol.name)}")
                fs = self.api.create_file_system(fs_name(vol.name), region)
            ours = str(fs.get("name")) == fs_name(vol.name)
            if not ours:
                self.report.info(f"file system {fs.get('name')} was not made by gtrain: attached as it is (gtrain "
                                 "never deletes it)")
            out.append({"name": vol.name, "id": fs.get("id"), "region": (fs.get("region") or {}).get("name"),
                        "size_gb": size_gib(fs) or 0, "type": "filesystem", "mount": vol.mount,
                        "file_system": fs.get("name"), "mount_point": fs.get("mount_point")
                        or f"/lambda/nfs/{fs.get('name')}", "gtrain_made": ours,
                        "usd_per_gb_month": USD_PER_GB_MONTH if ours else 0.0})
        return out

    # ---- down ----

    def kept(self, cluster: Cluster) -> list[VolumeInfo]:
        """The cluster's file systems as they are now (its instances are gone): each is left, with its charge."""
        fresh = self.store.get_cluster_by_id(cluster.id)
        records = [r for r in (fresh or cluster).extra.get("volumes") or [] if isinstance(r, dict)
                   and r.get("gtrain_made", True)]
        if not records:
            return []
        systems = {str(f.get("id")): f for f in self.api.file_systems()}
        out = [self.info(systems[str(r["id"])], []) for r in records if str(r.get("id")) in systems]
        sizes = {i.id: i.size_gb or 0 for i in out}  # what it holds now: the charge the cost report shows
        recs = [{**r, "size_gb": sizes.get(r.get("id"), r.get("size_gb") or 0)} if isinstance(r, dict) else r
                for r in (fresh or cluster).extra.get("volumes") or []]
        self.store.update_cluster(cluster.id, extra={**(fresh or cluster).extra, "volumes": recs})
        return out

    # ---- gtrain volume ----

    def delete(self, name: str, regions: list[str] | None) -> VolumeInfo | None:
        fs = next((f for f in self.api.file_systems() if f.get("name") == fs_name(name)
                   and (not regions or (f.get("region") or {}).get("name") in regions)), None)
        if fs is None:
            return None  # a file system gtrain did not make (named NAME) is never deleted here
        info = self.info(fs, self.api.instances())
        if info.attached_to:
            raise ConfigError(f"volume {name} (file system {fs['name']}) is mounted by cluster {info.attached_to}",
                              hint=f"`gtrain down {info.attached_to}` first", field="NAME")
        try:
            self.api.delete_file_system(str(fs["id"]))
        except GtrainError as e:
            if code_of(e) == IN_USE:
                raise ConfigError(f"volume {name}: Lambda refuses to delete file system {fs['name']}: it is "
                                  f"mounted by an instance ({e.message})", hint="terminate the instance that "
                                  "mounts it (`gtrain down CLUSTER`), then delete again", field="NAME") from None
            raise
        info.state = "deleted"
        return info
