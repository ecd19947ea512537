"""The EBS mount script (gtrain/providers/aws/volumes.py ``mount_script``) run by bash against stand-ins for
``sudo``, ``blkid``, ``mkfs.ext4``, ``mount`` and ``mountpoint`` (moto attaches nothing a node could mount): the
device is found by its NVMe id, a filesystem is made only on a blank volume, never on one that has one, a blank
read-only volume is refused, and a second run changes nothing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gtrain.providers.aws.volumes import mount_script

STUBS = {
    "sudo": 'echo "sudo $*" >> "$LOG"; exec "$@"',
    # exit 2: no signature (blank); 0: a filesystem is there
    "blkid": 'echo "blkid $*" >> "$LOG"; [ -f "$STATE/fs" ] && exit 0; exit 2',
    "mkfs.ext4": 'echo "mkfs $*" >> "$LOG"; touch "$STATE/fs"',
    "mount": 'echo "mount $*" >> "$LOG"; touch "$STATE/mounted"',
    "mountpoint": '[ -f "$STATE/mounted" ]',
    "chown": 'echo "chown $*" >> "$LOG"',
}


def run(tmp_path: Path, records: list[dict[str, object]]) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_, state = tmp_path / "bin", tmp_path / "state"
    bin_.mkdir(exist_ok=True)
    state.mkdir(exist_ok=True)
    for name, body in STUBS.items():
        (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    log = tmp_path / "log"
    log.write_text("")
    script = mount_script(records, wait_s=2).replace("/dev/disk/by-id/", f"{tmp_path}/by-id/")
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "LOG": str(log), "STATE": str(state)}
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)
    return r, log.read_text().splitlines()


def test_blank_volume_gets_a_filesystem_once_and_is_mounted(tmp_path: Path) -> None:
    (tmp_path / "by-id").mkdir()
    disk = tmp_path / "nvme1n1"
    disk.write_text("")
    (tmp_path / "by-id" / "nvme-Amazon_Elastic_Block_Store_vol0abc").symlink_to(disk)
    mnt = tmp_path / "data"
    rec = {"id": "vol-0abc", "name": "data", "mount": str(mnt), "device": "/dev/sdf", "read_only": False}
    r, log = run(tmp_path, [rec])
    assert r.returncode == 0, r.stderr
    assert [ln.split()[0] for ln in log if not ln.startswith("sudo")] == ["blkid", "mkfs", "mount", "chown"]
    assert any(ln.startswith("mkfs") and ln.endswith(str(disk)) for ln in log)
    assert f"mount {disk} {mnt}" in log and mnt.is_dir()
    # mounted already: nothing more
    r, log = run(tmp_path, [rec])
    assert r.returncode == 0 and "already mounted" in r.stdout and log == []
    # a volume with a filesystem (the next cluster's node): mounted, never formatted
    (tmp_path / "state" / "mounted").unlink()
    r, log = run(tmp_path, [rec])
    assert r.returncode == 0, r.stderr
    assert not any(ln.startswith(("mkfs", "chown")) for ln in log) and f"mount {disk} {mnt}" in log


def test_read_only_blank_is_refused_and_missing_device_named(tmp_path: Path) -> None:
    (tmp_path / "by-id").mkdir()
    disk = tmp_path / "nvme2n1"
    disk.write_text("")
    (tmp_path / "by-id" / "nvme-Amazon_Elastic_Block_Store_vol0def").symlink_to(disk)
    ro = {"id": "vol-0def", "name": "ref", "mount": str(tmp_path / "ref"), "device": "/dev/sdg", "read_only": True}
    r, log = run(tmp_path, [ro])
    assert r.returncode == 1 and "blank and read_only" in r.stderr and not any(ln.startswith("mkfs") for ln in log)
    (tmp_path / "state" / "fs").touch()
    r, log = run(tmp_path, [ro])
    assert r.returncode == 0 and f"mount -o ro {disk} {tmp_path / 'ref'}" in log
    gone = {"id": "vol-0zzz", "name": "gone", "mount": str(tmp_path / "g"), "device": "/dev/sdz", "read_only": False}
    r, _ = run(tmp_path, [gone])
    assert r.returncode == 1 and "volume gone (vol-0zzz) did not appear" in r.stderr
