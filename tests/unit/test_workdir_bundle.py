"""The workdir bundle (gtrain.jobs.workdir) and its node side (gtrain.remote.nodebundle), on this machine:
a deterministic tar named by its sha256; a node fetches it from node 0's short-lived HTTP server, refuses
bytes whose sha256 differs, unpacks like put_files, and refuses members that would leave the workdir."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gtrain.errors import ConfigError
from gtrain.jobs import workdir as wd
from gtrain.remote import nodebundle as nb


def _serve(directory: str, token: str) -> dict[str, int]:
    """node 0's server started as on a node: `python3 nodebundle.py serve ...` in a fresh process, which forks
    the server off (forking pytest itself would carry its threads' held locks and sockets into the server)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, nb.__file__, "serve", directory, "127.0.0.1", token, "30"],
                       capture_output=True, text=True, timeout=30, check=True, stdin=subprocess.DEVNULL)
    got: dict[str, int] = json.loads(r.stdout)
    return got


def _tree(root: Path) -> list[str]:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "data.bin").write_bytes(os.urandom(300_000))
    os.chmod(root / "train.py", 0o750)
    return ["pkg/data.bin", "train.py"]


def _files(root: Path) -> dict[str, tuple[bytes, int, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), int(p.stat().st_mtime), p.stat().st_mode & 0o777)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_bundle_is_deterministic_and_named_by_its_sha256(tmp_path: Path) -> None:
    files = _tree(tmp_path / "w")
    a = wd.build_bundle(tmp_path / "w", files, tmp_path / "b1")
    b = wd.build_bundle(tmp_path / "w", files, tmp_path / "b2")
    assert a.sha256 == b.sha256 == hashlib.sha256(a.path.read_bytes()).hexdigest()
    assert a.path.name == f"{a.sha256}.tar" and a.files == 2
    (tmp_path / "w" / "train.py").write_text("print('changed')\n")
    assert wd.build_bundle(tmp_path / "w", files, tmp_path / "b3").sha256 != a.sha256
    with tarfile.open(a.path) as tf:
        assert [(m.name, m.uid, m.uname) for m in tf.getmembers()] == [("pkg/data.bin", 0, ""), ("train.py", 0, "")]


def test_fetch_from_node0_server_verifies_unpacks_and_reuses(tmp_path: Path) -> None:
    files = _tree(tmp_path / "w")
    b = wd.build_bundle(tmp_path / "w", files, tmp_path / "b")
    seed = tmp_path / "node0"
    (seed / nb.BUNDLES).mkdir(parents=True)
    (seed / nb.BUNDLES / b.path.name).write_bytes(b.path.read_bytes())
    first = nb.fetch(json.dumps({"root": str(seed), "workdir": str(seed / "workdir"), "sha": b.sha256}))
    assert first["ok"] and first["cached"] and first["written"] == 2, first  # verified in place, unpacked
    token = "t" * 24
    srv = _serve(str(seed / nb.BUNDLES), token)
    try:
        url = f"http://127.0.0.1:{srv['port']}/{token}/{b.sha256}.tar"
        with pytest.raises(urllib.error.HTTPError):  # a wrong token is refused
            urllib.request.urlopen(f"http://127.0.0.1:{srv['port']}/{'x' * 24}/{b.sha256}.tar", timeout=5)
        node = tmp_path / "node1"
        doc = {"root": str(node), "workdir": str(node / "workdir"), "sha": b.sha256,
               "sources": [{"kind": "http", "url": url}]}
        got = nb.fetch(json.dumps(doc))
        assert got["ok"] and not got["cached"] and got["bytes"] == b.size and got["written"] == 2, got
        assert _files(node / "workdir") == _files(tmp_path / "w")
        again = nb.fetch(json.dumps(doc))  # the same bundle: not fetched again, nothing rewritten
        assert again["ok"] and again["cached"] and again["written"] == 0 and again["unchanged"] == 2, again
        assert nb.stop(str(seed / nb.BUNDLES), "y" * 24) == {"stopped": False}  # not the token it serves
    finally:
        assert nb.stop(str(seed / nb.BUNDLES), token) == {"stopped": True}
    end = time.monotonic() + 5
    while time.monotonic() < end and os.path.exists(f"/proc/{srv['pid']}"):
        time.sleep(0.05)
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def test_corrupt_bundle_is_refused_and_not_unpacked(tmp_path: Path) -> None:
    files = _tree(tmp_path / "w")
    b = wd.build_bundle(tmp_path / "w", files, tmp_path / "b")
    seed = tmp_path / "node0"
    (seed / nb.BUNDLES).mkdir(parents=True)
    bad = bytearray(b.path.read_bytes())
    bad[1000] ^= 0xFF
    (seed / nb.BUNDLES / b.path.name).write_bytes(bytes(bad))
    (seed / nb.BUNDLES / f"{b.sha256}.ok").write_text("forged\n")  # the server's own check trusted it
    token = "k" * 24
    srv = _serve(str(seed / nb.BUNDLES), token)
    try:
        node = tmp_path / "node1"
        got = nb.fetch(json.dumps({"root": str(node), "workdir": str(node / "workdir"), "sha": b.sha256,
                                   "sources": [{"kind": "http", "url": f"http://127.0.0.1:{srv['port']}/{token}/"
                                                f"{b.sha256}.tar"}], "tries": 2}))
    finally:
        nb.stop(str(seed / nb.BUNDLES), token)
    assert not got["ok"] and got["corrupt"], got
    assert str(got["error"]).count("sha256 mismatch") == 2  # fetched again once, refused both times
    assert not (node / "workdir").exists() and os.listdir(node / nb.BUNDLES) == []
    # a pushed copy whose bytes differ is removed, not trusted
    (seed / nb.BUNDLES / f"{b.sha256}.ok").unlink()
    assert nb.have(str(seed), b.sha256) == {"have": False}
    again = nb.fetch(json.dumps({"root": str(seed), "workdir": str(seed / "workdir"), "sha": b.sha256}))
    assert not again["ok"] and not (seed / nb.BUNDLES / b.path.name).exists()


def test_node0_adopts_the_upload_only_when_its_sha256_is_right(tmp_path: Path) -> None:
    files = _tree(tmp_path / "w")
    b = wd.build_bundle(tmp_path / "w", files, tmp_path / "b")
    seed = tmp_path / "node0"
    (seed / nb.BUNDLES).mkdir(parents=True)
    up = seed / nb.BUNDLES / nb.UPLOAD
    up.write_bytes(b.path.read_bytes()[:-512] + b"x" * 512)
    doc = {"root": str(seed), "workdir": str(seed / "workdir"), "sha": b.sha256, "adopt": True}
    bad = nb.fetch(json.dumps(doc))
    assert not bad["ok"] and bad["corrupt"] and not (seed / "workdir").exists(), bad
    up.write_bytes(b.path.read_bytes())
    good = nb.fetch(json.dumps(doc))
    assert good["ok"] and good["source"] == "upload" and good["written"] == 2, good
    assert nb.have(str(seed), b.sha256) == {"have": True}
    # the next bundle replaces this one; the upload stays as the basis of the next rsync delta
    (tmp_path / "w" / "train.py").write_text("print('v2')\n")
    b2 = wd.build_bundle(tmp_path / "w", files, tmp_path / "b")
    up.unlink()
    up.write_bytes(b2.path.read_bytes())
    assert nb.fetch(json.dumps({**doc, "sha": b2.sha256}))["ok"]
    assert sorted(os.listdir(seed / nb.BUNDLES)) == sorted([f"{b2.sha256}.tar", f"{b2.sha256}.ok", nb.UPLOAD])


def test_unreachable_source_is_tried_twice_then_reported(tmp_path: Path) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    url = f"http://127.0.0.1:{port}/{'t' * 24}/{'a' * 64}.tar"
    got = nb.fetch(json.dumps({"root": str(tmp_path), "workdir": str(tmp_path / "w"), "sha": "a" * 64,
                               "sources": [{"kind": "http", "url": url}]}))
    assert not got["ok"] and not got["corrupt"] and f"127.0.0.1:{port}" in str(got["error"]), got
    assert str(got["error"]).count("ConnectionRefusedError") + str(got["error"]).count("Connection refused") >= 2


@pytest.mark.parametrize("name", ["../evil", "/etc/evil", "a/../../evil"])
def test_members_that_leave_the_workdir_are_refused(tmp_path: Path, name: str) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo(name)
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    tar = tmp_path / "x.tar"
    tar.write_bytes(buf.getvalue())
    with pytest.raises(ValueError, match="refused"):
        nb.unpack(str(tar), str(tmp_path / "w"))
    assert not (tmp_path / "evil").exists()


def test_symlink_member_and_linked_folder_are_refused(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("link")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(info)
    (tmp_path / "a.tar").write_bytes(buf.getvalue())
    with pytest.raises(ValueError, match="not a plain file"):
        nb.unpack(str(tmp_path / "a.tar"), str(tmp_path / "w"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("out/f")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    (tmp_path / "b.tar").write_bytes(buf.getvalue())
    (tmp_path / "w").mkdir(exist_ok=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "w" / "out").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="link out of the workdir"):
        nb.unpack(str(tmp_path / "b.tar"), str(tmp_path / "w"))
    assert os.listdir(tmp_path / "elsewhere") == []


def test_pull_threshold_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert wd.pull_min_nodes() == wd.PULL_MIN_NODES
    monkeypatch.setenv("GTRAIN_WORKDIR_PULL_MIN_NODES", "2")
    assert wd.pull_min_nodes() == 2
    for bad in ("0", "many"):
        monkeypatch.setenv("GTRAIN_WORKDIR_PULL_MIN_NODES", bad)
        with pytest.raises(ConfigError, match="GTRAIN_WORKDIR_PULL_MIN_NODES") as e:
            wd.pull_min_nodes()
        assert e.value.field == "GTRAIN_WORKDIR_PULL_MIN_NODES"
