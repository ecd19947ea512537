"""``type: path`` volumes on real sshd hosts (tests/fixtures/sshd.py, each host with its own home): a folder missing
on one node is refused at ``up`` (exit 2, naming the node, nothing made on any host); once it is there, ``mount``
is a link to it on every node, and ``down`` leaves the folder."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from tests.integration.test_ssh_provider import cli, spec_for


def test_missing_folder_named_per_node_then_linked(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    h0, h1 = ssh_hosts[0], ssh_hosts[1]
    tag = uuid.uuid4().hex[:8]
    src_name = f"gtv-src-{tag}"
    in_host = f"{os.path.expanduser('~')}/{src_name}"  # the login user's home, as each host sees its own
    mount = Path(f"/tmp/gtv-{tag}/data")  # one /tmp for every host: the link is made once, found by the next
    spec = spec_for(tmp_path, [h0, h1], "vol-ssh")
    doc = json.loads(spec.read_text())
    doc["volumes"] = [{"name": "ds", "mount": str(mount), "path": in_host}]
    spec.write_text(json.dumps(doc))
    (h0.home / src_name).mkdir()
    try:
        r = cli("up", str(spec))
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        missing_on = "node 1 (" if h0.own_home else "node "
        assert f"volumes[0].path: {in_host} does not exist on {missing_on}" in r.stderr, r.stderr
        assert not (h0.home / "gtrain" / "vol-ssh").exists() and not mount.parent.exists()
        assert json.loads(cli("status", "--json").stdout) == {"clusters": []}
        (h1.home / src_name).mkdir(exist_ok=True)
        (h1.home / src_name / "f.txt").write_text("on host 1")
        r = cli("up", str(spec))
        assert r.returncode == 0, r.stderr
        assert os.readlink(mount) == in_host
        r = cli("exec", "vol-ssh", "--node", "1", "--", "cat", f"{mount}/f.txt")
        assert r.returncode == 0 and "on host 1" in r.stdout, (r.stdout, r.stderr)
        assert cli("down", "vol-ssh", "--yes").returncode == 0
        assert (h1.home / src_name / "f.txt").read_text() == "on host 1"  # down leaves the folder
    finally:
        cli("down", "vol-ssh", "--yes")
        if mount.is_symlink():
            mount.unlink()
        if mount.parent.is_dir():
            mount.parent.rmdir()
