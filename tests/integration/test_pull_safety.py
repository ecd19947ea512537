"""``gtrain pull`` through real local runners (node dirs on this machine): nothing written through a symlink
under DEST (items 13), conflicting names kept per node (25), no empty DEST and a sane default name (26),
and pull folders never synced back (14)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gtrain.errors import ConfigError, SyncError
from gtrain.remote.local import LocalRunner
from gtrain.sync.pull import MARKER, default_pull_dest, pull_dir
from gtrain.sync.workdir import list_workdir


def _node(tmp_path: Path, k: int, files: dict[str, bytes]) -> tuple[int, LocalRunner, str]:
    r = LocalRunner(tmp_path / f"node{k}", label=f"node {k}")
    ck = Path(r.root) / "workdir" / "ckpt"
    ck.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        (ck / rel).parent.mkdir(parents=True, exist_ok=True)
        (ck / rel).write_bytes(data)
    return k, r, str(ck)


def test_symlinked_subfolder_in_dest_is_refused_and_nothing_written_outside(tmp_path: Path) -> None:
    src = _node(tmp_path, 0, {"sub/model.pt": b"weights", "top.pt": b"t"})
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / "sub").symlink_to(elsewhere)
    with pytest.raises(SyncError, match=r"dest/sub is a symlink") as e:
        pull_dir([src], dest)
    assert "elsewhere" in e.value.message
    assert list(elsewhere.iterdir()) == []


def test_symlinked_partial_folder_and_final_file_are_refused(tmp_path: Path) -> None:
    src = _node(tmp_path, 0, {"model.pt": b"weights"})
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / ".gtrain-partial").symlink_to(elsewhere)
    with pytest.raises(SyncError, match=r"\.gtrain-partial is a symlink"):
        pull_dir([src], dest)
    assert list(elsewhere.iterdir()) == [] and not (dest / "model.pt").exists()
    (dest / ".gtrain-partial").unlink()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (dest / "model.pt").symlink_to(victim)
    with pytest.raises(SyncError, match=r"model\.pt is a symlink"):
        pull_dir([src], dest)
    assert victim.read_bytes() == b"precious" and (dest / "model.pt").is_symlink()


def test_a_symlinked_checkpoint_dir_on_the_node_is_refused(tmp_path: Path) -> None:
    node_home = tmp_path / "node-home"
    node_home.mkdir()
    (node_home / "id_rsa").write_bytes(b"private key")
    r = LocalRunner(tmp_path / "node0")
    (Path(r.root) / "workdir").mkdir(parents=True)
    (Path(r.root) / "workdir" / "ckpt").symlink_to(node_home)
    with pytest.raises(SyncError, match=r"node 0: .*workdir/ckpt is a symlink"):
        pull_dir([(0, r, f"{r.root}/workdir/ckpt")], tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def test_backslash_names_are_pulled_and_inner_links_skipped(tmp_path: Path) -> None:
    k, r, ck = _node(tmp_path, 0, {"a\\b.pt": b"bs", "ok.pt": b"ok"})
    (tmp_path / "outside").write_bytes(b"x")
    os.symlink(tmp_path / "outside", os.path.join(ck, "link.pt"))
    res = pull_dir([(k, r, ck)], tmp_path / "dest")
    assert res.transferred == ["a\\b.pt", "ok.pt"]
    assert (tmp_path / "dest" / "a\\b.pt").read_bytes() == b"bs"


def test_differing_files_on_two_nodes_are_both_kept_and_reported(tmp_path: Path) -> None:
    n0 = _node(tmp_path, 0, {"snapshot.pt": b"epoch 57", "same.pt": b"replica", "only0.pt": b"0"})
    n1 = _node(tmp_path, 1, {"snapshot.pt": b"epoch 0", "same.pt": b"replica"})
    os.utime(Path(n1[2]) / "snapshot.pt", (2e9, 2e9))  # the bad one is the newest: no silent pick
    dest = tmp_path / "dest"
    res = pull_dir([n0, n1], dest)
    assert res.conflicts == [{"path": "snapshot.pt", "nodes": [0, 1], "kept": ["node-0/snapshot.pt",
                                                                              "node-1/snapshot.pt"]}]
    assert res.to_dict()["conflicts"] == res.conflicts
    assert (dest / "node-0" / "snapshot.pt").read_bytes() == b"epoch 57"
    assert (dest / "node-1" / "snapshot.pt").read_bytes() == b"epoch 0"
    assert not (dest / "snapshot.pt").exists()
    assert (dest / "same.pt").read_bytes() == b"replica" and (dest / "only0.pt").exists()
    again = pull_dir([n0, n1], dest)
    assert again.transferred == [] and len(again.skipped) == 4


def test_nothing_to_pull_creates_no_dest_and_default_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _node(tmp_path, 0, {})
    dest = tmp_path / "demo-checkpoints"
    res = pull_dir([src], dest)
    assert res.files == 0 and not dest.exists()
    monkeypatch.chdir(tmp_path)
    assert default_pull_dest("demo", ".") == tmp_path / "demo-checkpoints"
    assert default_pull_dest("demo", "out/ckpt") == tmp_path / "demo-ckpt"
    assert default_pull_dest("demo", "checkpoints/") == tmp_path / "demo-checkpoints"


def test_dest_must_be_a_folder(tmp_path: Path) -> None:
    src = _node(tmp_path, 0, {"m.pt": b"m"})
    (tmp_path / "afile").write_text("x")
    for bad in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        with pytest.raises(ConfigError, match="--to"):
            pull_dir([src], bad)


def test_pull_folder_inside_a_workdir_is_not_synced_back(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print(1)")
    src = _node(tmp_path, 0, {"model.pt": b"big"})
    pull_dir([src], project / "demo-checkpoints")
    assert (project / "demo-checkpoints" / MARKER).is_file()
    (project / "mine").mkdir()  # a folder that existed before a pull into it is the user's: no marker
    (project / "mine" / "data.txt").write_text("d")
    pull_dir([src], project / "mine")
    assert not (project / "mine" / MARKER).exists()
    assert list_workdir(project) == ["mine/data.txt", "mine/model.pt", "train.py"]
