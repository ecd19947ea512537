"""What a cluster needs in a region before its nodes: the key pair (imported from the local ed25519 key), the
security group (22 from ``aws.ssh_cidr``, all traffic from itself), the cluster placement group, the subnet of
each zone (the default VPC's, or those of ``aws.vpc_id`` / ``aws.subnet_ids``) and the image. A part of
:class:`gtrain.providers.aws.AWSProvider`."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError, CredentialsError, GtrainError, ProviderError, QuotaError
from gtrain.providers.aws import api
from gtrain.providers.cloud.keys import ensure_key, key_path

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.providers.aws.options import AWSOptions
    from gtrain.providers.cloud.ledger import Ledger
    from gtrain.spec import ClusterSpec
    from gtrain.state import Cluster

#: newest first within each pattern; the first pattern that matches wins
DEFAULT_IMAGE_NAMES = (
    "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu 22.04) *",
    "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *",
    "Deep Learning AMI*Ubuntu*",
)
#: with job.image: only the DLAMIs whose release notes list Docker and the NVIDIA Container Toolkit
#: (docs.aws.amazon.com/dlami/latest/devguide, "Major package versions": nvidia_container_toolkit_version,
#: docker-ce); the generic fallback pattern could match an AMI without them
CONTAINER_IMAGE_NAMES = DEFAULT_IMAGE_NAMES[:2]


@dataclass
class Region:
    """What provisioning made (or found) in one region."""

    name: str
    key_name: str = ""
    sg_id: str = ""
    pg_name: str | None = None
    image_id: str = ""
    root_device: str = "/dev/sda1"
    subnets: dict[str, str] = field(default_factory=dict)  # zone -> default subnet
    created: list[tuple[str, str, int]] = field(default_factory=list)  # (kind, ref, ledger id) made by this call


class AWSNetwork:
    """Key pair, security group, placement group, subnets and image of one region (:meth:`setup`)."""

    def __init__(self, clients: api.EC2Clients, ledger: Ledger, report: Reporter) -> None:
        self.clients = clients
        self.ledger = ledger
        self.store = ledger.store
        self.report = report


    def setup(self, spec: ClusterSpec, cluster: Cluster, opts: AWSOptions, reg: Region,
                      ssh_cidr: str | None, itype: str, zones: list[str] | None) -> None:
        ec2 = self.clients.ec2(reg.name, opts.profile)
        name = api.resource_name(cluster.id)
        tags = api.base_tags(cluster, opts, name)
        want_pg = opts.placement_group if opts.placement_group is not None else spec.num_nodes > 1
        custom: tuple[str, dict[str, str]] | None = None
        if opts.vpc_id or opts.subnet_ids:  # the VPC first: the security group goes in it
            custom = self._custom_subnets(ec2, reg.name, opts, zones)
        with ThreadPoolExecutor(5) as pool:  # independent calls, in parallel
            f_img = pool.submit(self._image, ec2, reg.name, spec, opts)
            f_sub = pool.submit(self._subnets, ec2, reg.name, itype, zones, custom[1] if custom else None)
            f_key = pool.submit(self._ensure_key, ec2, cluster, reg, tags)
            f_sg = pool.submit(self._ensure_sg, ec2, cluster, reg, tags, ssh_cidr, custom[0] if custom else None)
            futs: list[Future[Any]] = [f_key, f_sg, f_img, f_sub]
            if want_pg:
                futs.append(pool.submit(self._ensure_pg, ec2, cluster, reg, tags, opts.placement_group is True))
            errs = []
            for f in futs:
                try:
                    f.result()
                except BaseException as e:  # noqa: BLE001 - re-raised below, after every future settled
                    errs.append(e)
            if errs:
                raise errs[0]
        reg.image_id, reg.root_device = f_img.result()
        reg.subnets = f_sub.result()

    def _image(self, ec2: Any, region: str, spec: ClusterSpec, opts: AWSOptions) -> tuple[str, str]:
        if spec.resources.image_id:
            try:
                with api.call(f"{region}: describe_images {spec.resources.image_id}"):
                    imgs = ec2.describe_images(ImageIds=[spec.resources.image_id])["Images"]
            except GtrainError as err:
                if not (api.is_not_found(err) or isinstance(err, ConfigError)):
                    raise
                imgs = []
            if not imgs:
                raise ConfigError(f"resources.image_id: {spec.resources.image_id} does not exist in {region}",
                                  hint="AMI ids are per region; leave image_id unset for the newest Deep Learning AMI",
                                  field="resources.image_id")
            return imgs[0]["ImageId"], imgs[0].get("RootDeviceName") or "/dev/sda1"
        with_image = spec.job is not None and bool(spec.job.image)
        patterns = opts.image_name or list(CONTAINER_IMAGE_NAMES if with_image else DEFAULT_IMAGE_NAMES)
        with api.call(f"{region}: describe_images"):
            imgs = ec2.describe_images(Owners=[opts.image_owner], Filters=[
                {"Name": "name", "Values": patterns}, {"Name": "state", "Values": ["available"]},
                {"Name": "architecture", "Values": ["x86_64"]},
            ])["Images"]
        if not imgs:
            raise ConfigError(f"resources.image_id: no AMI named like {' | '.join(patterns)} "
                              f"(owner {opts.image_owner}) in {region}",
                              hint="set resources.image_id, or aws.image_name", field="resources.image_id")

        def rank(img: dict[str, Any]) -> tuple[int, str]:
            idx = next((i for i, p in enumerate(patterns) if _glob(p, img.get("Name", ""))), len(patterns))
            return (idx, "".join(chr(0x10FFFF - ord(c)) for c in img.get("CreationDate", "")))

        best = min(imgs, key=rank)
        return best["ImageId"], best.get("RootDeviceName") or "/dev/sda1"

    def _custom_subnets(self, ec2: Any, region: str, opts: AWSOptions, zones: list[str] | None
                        ) -> tuple[str, dict[str, str]]:
        """(VPC id, zone -> subnet) from ``aws.subnet_ids`` (one VPC; the first subnet of each zone) or from
        every subnet of ``aws.vpc_id``."""
        fld = "aws.subnet_ids" if opts.subnet_ids else "aws.vpc_id"
        try:
            with api.call(f"{region}: describe_subnets"):
                if opts.subnet_ids:
                    subs = ec2.describe_subnets(SubnetIds=opts.subnet_ids)["Subnets"]
                else:
                    subs = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [opts.vpc_id]}])["Subnets"]
        except ProviderError as e:
            if not api.is_not_found(e):
                raise
            raise ConfigError(f"{fld}: {e.message}", hint=f"subnet and VPC ids belong to one region ({region} here)",
                              field=fld) from None
        vpcs = sorted({s["VpcId"] for s in subs})
        if not subs:
            raise ConfigError(f"aws.vpc_id: {opts.vpc_id} has no subnets in {region}", field="aws.vpc_id")
        if len(vpcs) > 1 or (opts.vpc_id and vpcs[0] != opts.vpc_id):
            raise ConfigError(f"{fld}: the subnets are in {', '.join(vpcs)}"
                              + (f", not in aws.vpc_id {opts.vpc_id}" if opts.vpc_id else ""),
                              hint="a cluster's nodes share one VPC (and one security group): give subnets of one VPC",
                              field=fld)
        by_zone: dict[str, str] = {}
        order = opts.subnet_ids or sorted(s["SubnetId"] for s in subs)
        for sid in order:
            s = next(x for x in subs if x["SubnetId"] == sid)
            by_zone.setdefault(s["AvailabilityZone"], sid)
        if zones:
            missing = [z for z in zones if z not in by_zone]
            if missing:
                raise ConfigError(f"resources.zones: no subnet of {fld} in {', '.join(missing)}",
                                  hint=f"add a subnet of that zone to {fld}, or leave resources.zones out",
                                  field="resources.zones")
            by_zone = {z: by_zone[z] for z in zones}
        return vpcs[0], by_zone

    def _subnets(self, ec2: Any, region: str, itype: str, zones: list[str] | None,
                 custom: dict[str, str] | None = None) -> dict[str, str]:
        if custom is not None:
            by_zone = custom
        else:
            with api.call(f"{region}: describe_subnets"):
                subs = ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
            by_zone = {s["AvailabilityZone"]: s["SubnetId"] for s in subs}
        if zones and custom is None:
            missing = [z for z in zones if z not in by_zone]
            if missing:
                raise ConfigError(f"resources.zones: no default subnet in {', '.join(missing)}",
                                  hint="gtrain uses the default VPC unless aws.vpc_id / aws.subnet_ids say "
                                       "otherwise; `aws ec2 create-default-subnet --availability-zone ZONE` "
                                       "makes one", field="resources.zones")
            return {z: by_zone[z] for z in zones}
        with api.call(f"{region}: describe_instance_type_offerings"):
            offered = {o["Location"] for o in ec2.describe_instance_type_offerings(
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": [itype]}])["InstanceTypeOfferings"]}
        items = by_zone.items() if custom is not None else sorted(by_zone.items())  # aws.subnet_ids: in its order
        return {z: s for z, s in items if z in offered}

    def _ensure_key(self, ec2: Any, cluster: Cluster, reg: Region, tags: dict[str, str]) -> None:
        name = api.resource_name(cluster.id)
        path = key_path(cluster.id)
        pub = ensure_key(cluster.id)
        with api.call(f"{reg.name}: describe_key_pairs"):
            have = ec2.describe_key_pairs(Filters=[{"Name": "key-name", "Values": [name]}])["KeyPairs"]
        if have:
            reg.key_name = name
            return
        rid = self.ledger.record(cluster, "key-pair", name, reg.name)
        with api.call(f"{reg.name}: import_key_pair"):
            kp = ec2.import_key_pair(KeyName=name, PublicKeyMaterial=pub.encode(),
                                     TagSpecifications=[{"ResourceType": "key-pair", "Tags": api.tags(tags)}])
        self.ledger.mark(rid, "created", meta={"key_pair_id": kp.get("KeyPairId"), "path": str(path)})
        reg.key_name = name
        reg.created.append(("key-pair", name, rid))

    def _ensure_sg(self, ec2: Any, cluster: Cluster, reg: Region, tags: dict[str, str], ssh_cidr: str | None,
                   vpc: str | None = None) -> None:
        name = api.resource_name(cluster.id)
        if vpc is None:
            with api.call(f"{reg.name}: describe_vpcs"):
                vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
            if not vpcs:
                raise ConfigError(f"resources.region: {reg.name} has no default VPC",
                                  hint="`aws ec2 create-default-vpc --region REGION` makes one, or name a VPC "
                                       "with aws.vpc_id / aws.subnet_ids", field="resources.region")
            vpc = vpcs[0]["VpcId"]
        with api.call(f"{reg.name}: describe_security_groups"):
            have = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": [name]},
                                                         {"Name": "vpc-id", "Values": [vpc]}])["SecurityGroups"]
        if have:
            reg.sg_id = have[0]["GroupId"]
            return
        rid = self.ledger.record(cluster, "security-group", name, reg.name)
        with api.call(f"{reg.name}: create_security_group"):
            sg = ec2.create_security_group(
                GroupName=name, Description=f"gtrain cluster {cluster.id}", VpcId=vpc,
                TagSpecifications=[{"ResourceType": "security-group", "Tags": api.tags(tags)}])["GroupId"]
        self.ledger.mark(rid, "created", ref=sg, meta={"name": name, "vpc": vpc})
        reg.sg_id = sg
        reg.created.append(("security-group", sg, rid))
        perms: list[dict[str, Any]] = [{"IpProtocol": "-1", "UserIdGroupPairs": [
            {"GroupId": sg, "Description": "all traffic inside the cluster (NCCL, rendezvous)"}]}]
        if ssh_cidr:
            rng = "Ipv6Ranges" if ":" in ssh_cidr else "IpRanges"
            key = "CidrIpv6" if ":" in ssh_cidr else "CidrIp"
            perms.append({"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                          rng: [{key: ssh_cidr, "Description": "gtrain ssh"}]})
        with api.call(f"{reg.name}: authorize_security_group_ingress"):
            ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=perms)

    def _ensure_pg(self, ec2: Any, cluster: Cluster, reg: Region, tags: dict[str, str], required: bool) -> None:
        name = api.resource_name(cluster.id)
        rid = self.ledger.record(cluster, "placement-group", name, reg.name)
        try:
            with api.call(f"{reg.name}: create_placement_group"):
                ec2.create_placement_group(GroupName=name, Strategy="cluster", TagSpecifications=[
                    {"ResourceType": "placement-group", "Tags": api.tags(tags)}])
        except ProviderError as e:
            if api.error_code(e) == "InvalidPlacementGroup.Duplicate":
                self.ledger.mark(rid, "not-created")  # made by an earlier run; that run's ledger row owns it
                reg.pg_name = name
                return
            self.ledger.mark(rid, "not-created")
            if required or isinstance(e, CredentialsError | QuotaError):
                raise
            self.report.warn(f"{reg.name}: no cluster placement group ({e.message}); nodes may land farther apart")
            return
        self.ledger.mark(rid, "created")
        reg.pg_name = name
        reg.created.append(("placement-group", name, rid))


def _glob(pattern: str, name: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(name, pattern)
