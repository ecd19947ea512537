"""What the VM clouds' volumes (docs/volumes.md) share once a disk is attached to a node: the bash that finds it
among the paths the cloud gives it on the node, makes a filesystem only on a blank one, mounts it, and grows the
filesystem when the disk was grown. Used by gcp (``/dev/disk/by-id/google-<deviceName>``) and azure
(``/dev/disk/azure/scsi1/lun<N>``); aws keeps its own (``gtrain/providers/aws/volumes.py``, the same steps)."""

from __future__ import annotations

import shlex
from typing import Any


def mount_script(records: list[dict[str, Any]], wait_s: int = 120) -> str:
    """bash for one node: for each record (``name``, ``id``, ``mount``, ``read_only``, ``candidates``: the device
    paths to look for, in order; ``grow``: the disk was made larger), wait for a candidate to appear, make an
    ext4 filesystem only when ``blkid -p`` finds no signature (exit 2: blank), mount it (``-o ro`` when read-only),
    give a fresh one to the login user, and run ``resize2fs`` on a grown one. Idempotent."""
    q = shlex.quote
    lines = ["set -eo pipefail", 'SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo']
    for r in records:
        name, vid, mnt = str(r["name"]), str(r["id"]), str(r["mount"])
        ro = bool(r.get("read_only"))
        lines += [
            f"# volume {name} at {mnt}",
            'dev=""',
            f"for _ in $(seq 1 {wait_s}); do",
            f"  for c in {' '.join(q(str(c)) for c in r['candidates'])}; do",
            '    if [ -e "$c" ]; then dev=$(readlink -f "$c"); break 2; fi',
            "  done; sleep 1",
            "done",
            f'[ -n "$dev" ] || {{ echo {q(f"gtrain: volume {name} ({vid}) did not appear on this node")} >&2; '
            "exit 1; }",
            f"if mountpoint -q {q(mnt)}; then echo {q(f'gtrain: {name} already mounted at {mnt}')}; else",
            '  rc=0; $SUDO blkid -p "$dev" >/dev/null 2>&1 || rc=$?',
            "  fresh=0",
            '  if [ "$rc" = 2 ]; then',
        ]
        if ro:
            lines.append(f"    echo {q(f'gtrain: volume {name} is blank and read_only: nothing to mount')} >&2; exit 1")
        else:
            lines += [f"    echo {q(f'gtrain: {name} is blank: making an ext4 filesystem')}",
                      f'    $SUDO mkfs.ext4 -q -L {q(("gtrain-" + name)[:16])} "$dev"; fresh=1']
        lines += [
            '  elif [ "$rc" != 0 ]; then echo "gtrain: blkid failed on $dev (exit $rc)" >&2; exit 1; fi',
            f"  $SUDO mkdir -p {q(mnt)}",
            f'  $SUDO mount {"-o ro " if ro else ""}"$dev" {q(mnt)}',
            f'  if [ "$fresh" = 1 ]; then $SUDO chown "$(id -u):$(id -g)" {q(mnt)}; fi',
            f"  echo {q(f'gtrain: mounted {name} at {mnt}')}",
            "fi",
        ]
        if r.get("grow") and not ro:  # ext4 grows online, mounted; a no-op when it fills the disk already
            lines.append(f'$SUDO resize2fs "$dev" >/dev/null 2>&1 && echo {q(f"gtrain: grew {name} to the disk")} '
                         f"|| echo {q(f'gtrain: resize2fs of {name} failed: grow it by hand')} >&2")
    return "\n".join(lines) + "\n"
