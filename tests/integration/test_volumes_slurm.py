"""``type: path`` volumes on the real Slurm fixture (tests/fixtures/slurm.py): a folder of the shared filesystem,
used where it is. Missing: exit 2 at ``up``, nothing made; a ``path`` other than ``mount`` is refused (a link made
on the login side would not be on the nodes); there: ``up`` and ``down`` leave it as it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.integration.test_slurm import cli, slurm_spec, write


def test_shared_folder_checked_and_left(slurm_cluster: Any, tmp_path: Path) -> None:
    shared = Path(slurm_cluster.shared) / f"vol-{tmp_path.name}"
    spec = slurm_spec(slurm_cluster, tmp_path, "sl-vol", "slurm_train.py")
    spec["volumes"] = [{"name": "ds", "mount": str(shared)}]
    r = cli("up", write(tmp_path, spec))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"volumes[0].mount: {shared} does not exist on" in r.stderr
    assert json.loads(cli("status", "--json").stdout) == {"clusters": []}
    assert not (Path(slurm_cluster.shared) / "gtrain" / "sl-vol").exists()
    spec["volumes"] = [{"name": "ds", "mount": str(shared), "path": str(tmp_path)}]
    r = cli("up", write(tmp_path, spec))
    assert r.returncode == 2 and "volumes[0].path: slurm uses the shared folder where it is" in r.stderr, r.stderr
    shared.mkdir()
    (shared / "x").write_text("kept")
    spec["volumes"] = [{"name": "ds", "mount": str(shared)}]
    r = cli("up", write(tmp_path, spec))
    assert r.returncode == 0, r.stderr
    assert cli("down", "sl-vol", "--yes").returncode == 0
    assert (shared / "x").read_text() == "kept"
