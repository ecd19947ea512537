"""Each fake refuses what its real service refuses, from the published schema (issue 40; the rules are in
tests/fixtures/api_rules.py): an unknown field, a wrong enum value, a missing or wrong credential, a wrong
api-version (Azure), an invalid Kubernetes name or label -- each answered as the real service answers it, so a
request gtrain sends that drifts from the published API fails a test instead of a user. Each test also sends the
valid request beside it: the fake refuses the one wrong thing, not everything."""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.fake_arm import SUBSCRIPTION, FakeARM
from tests.fixtures.fake_gce import GOOGLE_TOKEN, PROJECT, FakeGCE
from tests.fixtures.fake_kube import FakeKube
from tests.fixtures.fake_lambda import API_KEY, FakeLambda
from tests.fixtures.fake_tpu import FakeTPU


def call(url: str, body: Any = None, *, method: str = "POST", token: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), method=method,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None


def test_fake_lambda_refuses_what_api_1_10_0_refuses(fake_lambda: FakeLambda) -> None:
    url = fake_lambda.endpoint
    key = call(f"{url}/ssh-keys", {"name": "refuse-k", "public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake x"},
               token=API_KEY)
    assert key[0] == 200, key
    ok: dict[str, Any] = {"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10", "ssh_key_names": ["refuse-k"],
          "name": "refuse-0"}
    bad = {"unknown field": {**ok, "quantity": 1},  # what gtrain sent until 1.10.0 dropped it
           "wrong enum": {**ok, "region_name": "mars-east-1"},
           "wrong type": {**ok, "ssh_key_names": "refuse-k"},
           "missing field": {k: v for k, v in ok.items() if k != "instance_type_name"},
           "too long": {**ok, "name": "x" * 65}}
    for why, body in bad.items():
        code, doc = call(f"{url}/instance-operations/launch", body, token=API_KEY)
        assert code == 400 and doc["error"]["code"] == "global/invalid-parameters", (why, code, doc)
    code, doc = call(f"{url}/ssh-keys", {"name": "refuse-k2", "public_key": "ssh-rsa AAAA x", "labels": {}},
                     token=API_KEY)
    assert code == 400 and "labels: unknown field" in doc["error"]["message"], doc
    for token in (None, "not-the-key"):
        code, doc = call(f"{url}/instance-operations/launch", ok, token=token)
        assert code == 401 and doc["error"]["code"] == "global/invalid-api-key", (token, code, doc)
    assert fake_lambda.launches == [] or all(b.get("name") != "refuse-0" for b in fake_lambda.launches)
    code, doc = call(f"{url}/instance-operations/launch", ok, token=API_KEY)  # the valid one is taken
    assert code == 200, doc
    iid = doc["data"]["instance_ids"][0]
    assert call(f"{url}/instance-operations/terminate", {"instance_ids": [iid], "force": True},
                token=API_KEY)[0] == 400
    assert call(f"{url}/instance-operations/terminate", {"instance_ids": [iid]}, token=API_KEY)[0] == 200
    # the session's fake is shared: leave no key behind (the e2e tests check that nothing is left); the fake, as
    # Lambda, refuses to delete a key its terminated instance still names, so its state is cleaned directly
    for kid in [k for k, v in fake_lambda.keys.items() if v["name"] == "refuse-k"]:
        del fake_lambda.keys[kid]


def test_fake_compute_engine_refuses_what_the_api_refuses(fake_gce: FakeGCE) -> None:
    base = f"{fake_gce.endpoint}/compute/v1/projects/{PROJECT}"
    fw = {"name": "gtrain-refuse-fw", "network": "global/networks/default", "direction": "INGRESS",
          "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}], "sourceRanges": ["198.51.100.7/32"]}
    vm = {"name": "refuse-vm", "machineType": "zones/us-central1-a/machineTypes/n1-standard-4",
          "scheduling": {"provisioningModel": "CHEAP"}}
    cases = [(f"{base}/global/firewalls", {**fw, "sourceCidrs": ["0.0.0.0/0"]}, "Unknown name \"sourceCidrs\""),
             (f"{base}/global/firewalls", {**fw, "direction": "SIDEWAYS"}, "firewall.direction"),
             (f"{base}/zones/us-central1-a/instances", {**vm, "gpus": 1}, "Unknown name \"gpus\""),
             (f"{base}/zones/us-central1-a/instances", vm, "instance.scheduling.provisioningModel")]
    for url, body, said in cases:
        code, doc = call(url, body, token=GOOGLE_TOKEN)
        assert code == 400 and said in doc["error"]["message"], (body, code, doc)
    for token in (None, "ya29.someone-else"):
        code, doc = call(f"{base}/global/firewalls", fw, token=token)
        assert code == 401 and doc["error"]["status"] == "UNAUTHENTICATED", (token, code, doc)
    code, doc = call(f"{base}/global/firewalls", fw, token=GOOGLE_TOKEN)  # the valid one is taken
    assert code == 200, doc
    assert call(f"{base}/global/firewalls/gtrain-refuse-fw", method="DELETE", token=GOOGLE_TOKEN)[0] == 200


def test_fake_cloud_tpu_refuses_what_the_api_refuses(fake_tpu: FakeTPU) -> None:
    parent = f"projects/{PROJECT}/locations/us-central2-b"
    url = f"{fake_tpu.endpoint}/v2/{parent}/nodes?nodeId=refuse-tpu"
    node = {"acceleratorType": "v4-8", "runtimeVersion": "tpu-ubuntu2204-base",
            "labels": {"gtrain-cluster": "refuse-tpu"}, "networkConfig": {"network": "global/networks/default"},
            "metadata": {"ssh-keys": "gtrain:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIRefuse gtrain"}}
    bad = {"unknown field": {**node, "acceleratorCount": 8},
           "unknown nested field": {**node, "networkConfig": {"network": "global/networks/default", "vpc": "x"}},
           "wrong enum": {**{k: v for k, v in node.items() if k != "acceleratorType"},
                          "acceleratorConfig": {"type": "V9", "topology": "2x2x1"}},
           "wrong type": {**node, "tags": "gtrain"}}
    for why, body in bad.items():
        code, doc = call(url, body, token=GOOGLE_TOKEN)
        assert code == 400 and doc["error"]["status"] == "INVALID_ARGUMENT", (why, code, doc)
    qr = f"{fake_tpu.endpoint}/v2/{parent}/queuedResources?queuedResourceId=refuse-q"
    code, doc = call(qr, {"tpu": {"nodeSpec": [{"parent": parent, "nodeId": "refuse-q", "node": node}]},
                          "spot": {}, "priority": "HIGH"}, token=GOOGLE_TOKEN)
    assert code == 400 and "priority: unknown field" in doc["error"]["message"], doc
    for token in (None, "ya29.someone-else"):  # the real API takes no request without a credential
        code, doc = call(url, node, token=token)
        assert code == 401 and doc["error"]["status"] == "UNAUTHENTICATED", (token, code, doc)
        code, doc = call(f"{fake_tpu.endpoint}/v2/{parent}/nodes", method="GET", token=token)
        assert code == 401, doc
    assert call(url, node, token=GOOGLE_TOKEN)[0] == 200  # the valid one is taken
    assert call(f"{fake_tpu.endpoint}/v2/{parent}/nodes/refuse-tpu", method="DELETE", token=GOOGLE_TOKEN)[0] == 200


def _ssh_rsa(bits: int) -> str:
    n = (1 << (bits - 1)) | 1
    blob = b"".join(len(p).to_bytes(4, "big") + p for p in (b"ssh-rsa", b"\x01\x00\x01",
                                                            b"\x00" + n.to_bytes(bits // 8, "big")))
    return "ssh-rsa " + base64.b64encode(blob).decode() + " gtrain"


def test_fake_arm_refuses_what_arm_refuses(fake_arm: FakeARM) -> None:
    sub = f"{fake_arm.endpoint}/subscriptions/{SUBSCRIPTION}"
    group = f"{sub}/resourcegroups/gtrain-refuse"
    tok = fake_arm.token
    assert call(f"{group}?api-version=2021-04-01", {"location": "eastus"}, method="PUT", token=tok)[0] == 201
    code, doc = call(f"{group}?api-version=2099-01-01", {"location": "eastus"}, method="PUT", token=tok)
    assert code == 400 and doc["error"]["code"] == "InvalidApiVersionParameter", doc
    code, doc = call(f"{group}?api-version=2021-04-01", {"location": "eastus"}, method="PUT", token="stolen")
    assert code == 401 and doc["error"]["code"] == "InvalidAuthenticationToken", doc
    net = f"{sub}/resourceGroups/gtrain-refuse/providers/Microsoft.Network"
    nsg = {"location": "eastus", "properties": {"securityRules": [{"name": "r", "properties": {
        "priority": 1000, "direction": "Inbound", "access": "Allow", "protocol": "Tcp", "sourceAddressPrefix": "*",
        "sourcePortRange": "*", "destinationAddressPrefix": "*", "destinationPortRange": "22"}}]}}
    code, doc = call(f"{net}/networkSecurityGroups/n?api-version=2024-07-01", nsg, method="PUT", token=tok)
    assert code == 400 and doc["error"]["code"] == "NoRegisteredProviderFound", doc  # Compute's version
    bad_rule = json.loads(json.dumps(nsg))
    bad_rule["properties"]["securityRules"][0]["properties"]["access"] = "Maybe"
    code, doc = call(f"{net}/networkSecurityGroups/n?api-version=2023-09-01", bad_rule, method="PUT", token=tok)
    assert code == 400 and "access" in doc["error"]["message"], doc
    vm_url = f"{sub}/resourceGroups/gtrain-refuse/providers/Microsoft.Compute/virtualMachines/refuse-vm"
    vm: dict[str, Any] = {"location": "eastus", "properties": {
        "hardwareProfile": {"vmSize": "Standard_NC24ads_A100_v4"},
        "osProfile": {"computerName": "refuse-vm", "adminUsername": "gtrain", "linuxConfiguration": {
            "disablePasswordAuthentication": True, "ssh": {"publicKeys": [{
                "path": "/home/gtrain/.ssh/authorized_keys", "keyData": _ssh_rsa(3072)}]}}}}}
    cases = [("unknown member", {**vm, "properties": {**vm["properties"], "gpuCount": 1}}, "InvalidRequestContent"),
             ("wrong enum", {**vm, "properties": {**vm["properties"], "priority": "Cheap"}}, "InvalidParameter")]
    for key, code_want in ((_ssh_rsa(1024), "InvalidParameter"),
                           ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake gtrain", "InvalidParameter")):
        weak = json.loads(json.dumps(vm))
        weak["properties"]["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"] = key
        cases.append((f"key {key.split()[0]}", weak, code_want))
    for why, body, want in cases:
        code, doc = call(f"{vm_url}?api-version=2024-07-01", body, method="PUT", token=tok)
        assert code == 400 and doc["error"]["code"] == want, (why, code, doc)
    assert "keyData" in call(f"{vm_url}?api-version=2024-07-01", cases[-1][1], method="PUT",
                             token=tok)[1]["error"]["message"]
    code, doc = call(f"{vm_url}?api-version=2023-09-01", vm, method="PUT", token=tok)  # Network's version
    assert code == 400 and doc["error"]["code"] == "NoRegisteredProviderFound", doc
    code, doc = call(f"{group}?api-version=2021-04-01", method="DELETE", token=tok)
    assert code == 202, doc


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    root = Path(tempfile.mkdtemp(prefix="gtrain-kube-"))
    k = FakeKube(root).start()
    try:
        yield k
    finally:
        k.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_fake_kubernetes_refuses_what_the_api_server_refuses(kube: FakeKube) -> None:
    base = f"http://127.0.0.1:{kube.port}"
    url = f"{base}/api/v1/namespaces/default"

    def cm(name: str, **meta: Any) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **meta}, "data": {"a": "b"}}

    invalid = {"upper case name": cm("Refuse-CM"), "name with _": cm("refuse_cm"), "name over 253": cm("a" * 254),
               "label value over 63": cm("refuse-a", labels={"gtrain.dev/job": "j" * 64}),
               "label key over 63": cm("refuse-b", labels={"k" * 64: "v"}),
               "label value charset": cm("refuse-c", labels={"gtrain.dev/job": "a b"})}
    for why, body in invalid.items():
        code, doc = call(f"{url}/configmaps", body, token=kube.token)
        assert code == 422 and doc["reason"] == "Invalid" and doc["details"]["causes"], (why, code, doc)
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "1refuse"},
           "spec": {"clusterIP": "None", "selector": {"a": "b"}}}
    code, doc = call(f"{url}/services", svc, token=kube.token)  # a Service's name is a DNS-1035 label
    assert code == 422 and "DNS-1035" in doc["details"]["causes"][0]["message"], doc
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "refuse-pod"},
           "spec": {"restartPolicy": "Sometimes", "containers": [{"name": "c", "image": "busybox"}]}}
    code, doc = call(f"{url}/pods", pod, token=kube.token)
    assert code == 422 and doc["details"]["causes"][0]["reason"] == "FieldValueNotSupported", doc
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j" * 64},
           "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "b"}]}}}}
    code, doc = call(f"{base}/apis/batch/v1/namespaces/default/jobs", job, token=kube.token)
    assert code == 422 and "63" in doc["details"]["causes"][0]["message"], doc  # its pods' job-name label
    code, doc = call(f"{url}/configmaps", {**cm("refuse-d"), "bogus": 1}, token=kube.token)
    assert code == 400 and 'unknown field "bogus"' in doc["message"], doc
    code, doc = call(f"{url}/configmaps", cm("refuse-ok"), token="stolen")
    assert code == 401 and doc["reason"] == "Unauthorized", doc
    assert call(f"{url}/configmaps", cm("refuse-ok", labels={"gtrain.dev/job": "j-1.a_b"}),
                token=kube.token)[0] == 201  # the valid one is taken
