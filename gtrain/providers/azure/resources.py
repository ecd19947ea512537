"""The ARM resources of one gtrain cluster, all in its own resource group ``gtrain-<cluster id>``: the group,
a network security group (tcp 22 from ``azure.ssh_cidr`` only; the VNet's own traffic is allowed by the NSG's
default rules, for NCCL and the rendezvous), a virtual network with one subnet, and per node a Standard public
IP (unless reached through a proxy), a NIC and a VM. Every resource carries the ``gtrain-cluster`` tag.

Request bodies follow the REST references: Resources "Resource Groups - Create Or Update"
(https://learn.microsoft.com/rest/api/resources/resource-groups/create-or-update), Network "Network Security
Groups", "Virtual Networks", "Public IP Addresses", "Network Interfaces - Create Or Update"
(https://learn.microsoft.com/rest/api/virtualnetwork/), Compute "Virtual Machines - Create Or Update"
(https://learn.microsoft.com/rest/api/compute/virtual-machines/create-or-update); Spot VMs are
``priority: Spot``, ``evictionPolicy: Delete``, ``billingProfile.maxPrice: -1`` (pay up to on-demand, evicted
only for capacity: https://learn.microsoft.com/azure/virtual-machines/spot-vms)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gtrain.providers.azure import api
from gtrain.providers.azure.api import V_COMPUTE, V_NETWORK, V_RESOURCES

if TYPE_CHECKING:
    from gtrain.providers.azure.options import AzureOptions


@dataclass
class NodeBody:
    """What every VM of the cluster shares."""

    location: str
    size: str
    spot: bool
    disk_gb: int
    image: str  # URN or an image resource id
    public_key: str
    tags: dict[str, str]


class AzureResources:
    """The ARM calls on one cluster's resource group."""

    def __init__(self, arm: api.ARM_Client) -> None:
        self.arm = arm

    def group_path(self, group: str) -> str:
        return self.arm.sub(f"/resourcegroups/{group}")

    def _net(self, group: str, rest: str) -> str:
        return self.arm.sub(f"/resourceGroups/{group}/providers/Microsoft.Network/{rest}")

    def _vm(self, group: str, name: str) -> str:
        return self.arm.sub(f"/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines/{name}")

    # ---- the group ----

    def group(self, group: str) -> dict[str, Any] | None:
        got: dict[str, Any] | None = self.arm.get(self.group_path(group), V_RESOURCES, f"resourceGroups.get {group}")
        return got

    def make_group(self, group: str, location: str, tags: dict[str, str]) -> None:
        self.arm.put(self.group_path(group), V_RESOURCES, {"location": location, "tags": tags},
                     f"resourceGroups.createOrUpdate {group}")

    def delete_group(self, group: str) -> None:
        """Delete the group and everything in it; waits until ARM says it is gone."""
        self.arm.delete(self.group_path(group), V_RESOURCES, f"resourceGroups.delete {group}")

    def tagged_groups(self, cluster_id: str | None = None) -> list[dict[str, Any]]:
        """Resource groups tagged ``gtrain-cluster`` (= ``cluster_id`` when given)."""
        flt = f"tagName eq '{api.TAG_CLUSTER}'" + (f" and tagValue eq '{cluster_id}'" if cluster_id else "")
        from urllib.parse import quote

        groups = self.arm.list(self.arm.sub(f"/resourcegroups?$filter={quote(flt)}"), V_RESOURCES,
                               "resourceGroups.list")
        return [g for g in groups if (g.get("tags") or {}).get(api.TAG_CLUSTER)
                and (cluster_id is None or g["tags"][api.TAG_CLUSTER] == cluster_id)]

    # ---- the network ----

    def make_network(self, group: str, location: str, tags: dict[str, str], opts: AzureOptions,
                     ssh_cidr: str | None) -> str:
        """The NSG and the VNet with its subnet; returns the subnet id."""
        rules = []
        if ssh_cidr:
            rules.append({"name": "gtrain-ssh", "properties": {
                "priority": 1000, "direction": "Inbound", "access": "Allow", "protocol": "Tcp",
                "sourceAddressPrefix": ssh_cidr, "sourcePortRange": "*", "destinationAddressPrefix": "*",
                "destinationPortRange": "22"}})
        nsg = self.arm.put(self._net(group, "networkSecurityGroups/gtrain-nsg"), V_NETWORK,
                           {"location": location, "tags": tags, "properties": {"securityRules": rules}},
                           f"networkSecurityGroups.createOrUpdate {group}/gtrain-nsg")
        net = ipaddress.ip_network(opts.vnet_cidr)
        subnet = str(next(net.subnets(new_prefix=24)) if net.prefixlen < 24 else net)
        vnet = self.arm.put(self._net(group, "virtualNetworks/gtrain-vnet"), V_NETWORK, {
            "location": location, "tags": tags, "properties": {
                "addressSpace": {"addressPrefixes": [opts.vnet_cidr]},
                "subnets": [{"name": "nodes", "properties": {"addressPrefix": subnet,
                                                             "networkSecurityGroup": {"id": nsg["id"]}}}]}},
            f"virtualNetworks.createOrUpdate {group}/gtrain-vnet")
        return str(vnet["properties"]["subnets"][0]["id"])

    # ---- a node ----

    def vm(self, group: str, name: str, view: bool = False) -> dict[str, Any] | None:
        path = self._vm(group, name) + ("?$expand=instanceView" if view else "")
        got: dict[str, Any] | None = self.arm.get(path, V_COMPUTE, f"virtualMachines.get {name}")
        return got

    def make_node(self, group: str, name: str, rank: int, body: NodeBody, subnet_id: str, opts: AzureOptions,
                  public: bool) -> dict[str, Any]:
        """Public IP (when ``public``), NIC and VM of one node, each waited for; returns the node's addresses."""
        tags = {**body.tags, api.TAG_RANK: str(rank)}
        ip_cfg: dict[str, Any] = {"subnet": {"id": subnet_id}, "privateIPAllocationMethod": "Dynamic"}
        pip = None
        if public:
            pip = self.arm.put(self._net(group, f"publicIPAddresses/{name}-ip"), V_NETWORK, {
                "location": body.location, "tags": tags, "sku": {"name": "Standard"},
                "properties": {"publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4"}},
                f"publicIPAddresses.createOrUpdate {name}-ip")
            ip_cfg["publicIPAddress"] = {"id": pip["id"], "properties": {"deleteOption": "Delete"}}
        nic = self.arm.put(self._net(group, f"networkInterfaces/{name}-nic"), V_NETWORK, {
            "location": body.location, "tags": tags, "properties": {
                "enableAcceleratedNetworking": opts.accelerated_networking,
                "ipConfigurations": [{"name": "ipconfig1", "properties": ip_cfg}]}},
            f"networkInterfaces.createOrUpdate {name}-nic")
        if body.image.startswith("/"):
            image: dict[str, Any] = {"id": body.image}
        else:
            publisher, offer, sku, version = body.image.split(":")
            image = {"publisher": publisher, "offer": offer, "sku": sku, "version": version}
        props: dict[str, Any] = {
            "hardwareProfile": {"vmSize": body.size},
            "storageProfile": {"imageReference": image, "osDisk": {
                "name": f"{name}-osdisk", "createOption": "FromImage", "diskSizeGB": body.disk_gb,
                "deleteOption": "Delete", "managedDisk": {"storageAccountType": opts.os_disk_type}}},
            "osProfile": {"computerName": name, "adminUsername": opts.ssh_user, "linuxConfiguration": {
                "disablePasswordAuthentication": True, "ssh": {"publicKeys": [{
                    "path": f"/home/{opts.ssh_user}/.ssh/authorized_keys", "keyData": body.public_key}]}}},
            "networkProfile": {"networkInterfaces": [{"id": nic["id"],
                                                      "properties": {"primary": True, "deleteOption": "Delete"}}]},
        }
        if body.spot:
            props.update({"priority": "Spot", "evictionPolicy": "Delete", "billingProfile": {"maxPrice": -1}})
        self.arm.put(self._vm(group, name), V_COMPUTE, {"location": body.location, "tags": tags,
                                                       "properties": props},
                     f"virtualMachines.createOrUpdate {name} ({body.size}, {body.location})")
        return self.addresses(group, name)

    def addresses(self, group: str, name: str) -> dict[str, Any]:
        """The node's private address (its NIC) and public one (its public IP, None without one)."""
        nic = self.arm.get(self._net(group, f"networkInterfaces/{name}-nic"), V_NETWORK,
                           f"networkInterfaces.get {name}-nic") or {}
        cfg = ((nic.get("properties") or {}).get("ipConfigurations") or [{}])[0].get("properties") or {}
        pip = self.arm.get(self._net(group, f"publicIPAddresses/{name}-ip"), V_NETWORK,
                           f"publicIPAddresses.get {name}-ip") if cfg.get("publicIPAddress") else None
        return {"private_ip": cfg.get("privateIPAddress"),
                "public_ip": ((pip or {}).get("properties") or {}).get("ipAddress")}

    def delete_node(self, group: str, name: str) -> None:
        """The VM (its OS disk goes with it), then its NIC and public IP; each already gone is no error."""
        self.arm.delete(self._vm(group, name), V_COMPUTE, f"virtualMachines.delete {name}")
        self.arm.delete(self._net(group, f"networkInterfaces/{name}-nic"), V_NETWORK,
                        f"networkInterfaces.delete {name}-nic")
        self.arm.delete(self._net(group, f"publicIPAddresses/{name}-ip"), V_NETWORK,
                        f"publicIPAddresses.delete {name}-ip")

    def vms(self, group: str) -> list[dict[str, Any]]:
        try:
            return self.arm.list(self.arm.sub(f"/resourceGroups/{group}/providers/Microsoft.Compute/virtualMachines"),
                                 V_COMPUTE, f"virtualMachines.list {group}")
        except Exception as e:
            if api.is_not_found(e):
                return []
            raise


def power_state(vm: dict[str, Any]) -> str:
    """``running``, ``deallocated``, ``stopped``, ``starting``... from the VM's instance view ("" if none)."""
    for s in ((vm.get("properties") or {}).get("instanceView") or {}).get("statuses") or []:
        code = str(s.get("code") or "")
        if code.startswith("PowerState/"):
            return code.split("/", 1)[1]
    return ""
