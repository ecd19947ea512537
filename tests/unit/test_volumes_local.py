"""``type: path`` volumes on the local provider: the folder must exist (else exit 2 and nothing is made), ``mount``
becomes a link to it, ``down`` leaves both; a mount over ``$GTRAIN_HOME`` is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gtrain.context import Context
from gtrain.errors import ConfigError
from gtrain.runs import cluster as core
from gtrain.spec import parse_spec


def test_missing_folder_refused_then_linked_and_left_by_down(tmp_path: Path, gtrain_home: Path) -> None:
    src, mnt = tmp_path / "datasets", tmp_path / "mnt" / "data"
    s = parse_spec({"name": "vl", "num_nodes": 2, "volumes": [{"name": "ds", "mount": str(mnt), "path": str(src)}]})
    ctx = Context()
    try:
        assert any(f"ds at {mnt} (a link to {src})" in n for n in core.up(s, ctx, dry_run=True).plan.notes)
        with pytest.raises(ConfigError, match=f"{src} does not exist on this machine") as e:
            core.up(s, ctx)
        assert e.value.field == "volumes[0].path" and e.value.exit_code == 2
        assert not (gtrain_home / "clusters" / "vl").exists() and not mnt.parent.exists()
        assert ctx.store.find_cluster("vl") is None or ctx.store.find_cluster("vl").status == "terminated"
        src.mkdir()
        (src / "x.txt").write_text("kept")
        assert core.up(s, ctx).cluster is not None
        assert mnt.readlink() == src and (mnt / "x.txt").read_text() == "kept"
        core.down("vl", ctx)
        assert (mnt / "x.txt").read_text() == "kept"  # down leaves the folder (and the link)
        assert core.up(s, ctx).cluster is not None  # the link is there already: fine
        core.down("vl", ctx)
        inside = parse_spec({"name": "vh", "volumes": [{"name": "h", "mount": str(gtrain_home / "x")}]})
        gtrain_home.mkdir(exist_ok=True)
        with pytest.raises(ConfigError, match="overlaps gtrain's own folder"):
            core.up(inside, ctx)
    finally:
        ctx.store.close()


def test_cli_names_the_folder_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(json.dumps({"name": "vc", "volumes": [{"name": "d", "mount": str(tmp_path / "nope")}]}))
    r = subprocess.run([sys.executable, "-m", "gtrain", "up", str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"volumes[0].mount: {tmp_path / 'nope'} does not exist on this machine" in r.stderr
