"""End to end on azure (the fake Azure Resource Manager): `gtrain run` (the CLI) makes one resource group with 2
VMs; their SSH goes through ``azure.ssh_proxy_command`` (%h = the VM name) to two real sshd hosts
(tests/fixtures/sshd.py) by tests/integration/node_relay.py, which installs the key of the VM's osProfile as
the Azure Linux agent would. A real 2-node x 2-process torchrun job (gloo, CPU) runs there and exits 0, its
checkpoint is pulled, and the resource group is gone afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.fake_arm import FakeARM
from tests.fixtures.sshd import cloud_login
from tests.integration.node_relay import relay_hosts

JOBS = Path(__file__).parent / "jobs"
RELAY = Path(__file__).parent / "node_relay.py"


@pytest.mark.slow
def test_gtrain_run_two_nodes_two_processes_on_azure_vms(fake_arm: FakeARM, ssh_hosts, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                         gtrain_home: Path) -> None:
    relay_dir = tmp_path / "relay"
    hosts = relay_hosts(ssh_hosts, relay_dir)
    work = tmp_path / "work"
    work.mkdir()
    (work / "probe.py").write_text((JOBS / "probe.py").read_text())
    spec = tmp_path / "azure-e2e.yaml"
    spec.write_text(json.dumps({
        "name": "az-e2e", "provider": "azure", "num_nodes": 2,
        "resources": {"accelerators": "T4:1", "region": "eastus", "disk_gb": 64},
        "azure": {"ssh_user": cloud_login(hosts[0].user),
                  "ssh_proxy_command": f"{sys.executable} {RELAY} azure {relay_dir} %h",
                  "ssh_timeout_s": 60, "poll_s": 0.2},
        "job": {"workdir": str(work), "run": "probe.py", "nproc_per_node": 2, "checkpoint_dir": "ckpt",
                "python": sys.executable, "env": {"OMP_NUM_THREADS": "1"}},
    }))
    fake_arm.throttle_every = 7
    r = subprocess.run([sys.executable, "-m", "gtrain", "run", str(spec), "--yes", "--no-report",
                        "--to", str(tmp_path / "out")], capture_output=True, text=True, timeout=400,
                       stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert sorted(int(ln.split("hello from rank ")[1].split("/")[0]) for ln in out.splitlines()
                  if "hello from rank " in ln) == [0, 1, 2, 3], out[-3000:]
    assert (tmp_path / "out").exists() and list((tmp_path / "out").rglob("model.bin"))
    mapping = json.loads((relay_dir / "map.json").read_text())
    assert len(mapping) == 2 and all(name.endswith(("-0", "-1")) for name in mapping)
    cid = next(iter(mapping)).rsplit("-", 1)[0]
    assert fake_arm.of_cluster(cid) == []  # down deleted the resource group
    assert any(req.startswith("DELETE ") and req.endswith(f"/resourcegroups/gtrain-{cid}") for req in fake_arm.requests)
    with fake_arm.lock:
        assert fake_arm.groups == {} and fake_arm.resources == {}
