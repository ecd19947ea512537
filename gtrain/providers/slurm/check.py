"""``gtrain check slurm``: whether this machine is a Slurm login side (``sinfo`` on PATH, the cluster
``SLURM_CONF`` or Slurm's own default names), ``sinfo`` there (read-only), and the GPUs its partitions' nodes
offer (GRES). A login node reached over SSH is a spec's ``slurm.login``: checked by ``gtrain up`` of that spec,
not here. The nodes are reached through the login side and Slurm (no key of gtrain's)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from gtrain.providers.base import ProviderCheck

FIX = "run gtrain on the cluster's login node, or give the spec `slurm: {login: user@login-host}`"
KEY = "the login side's own (~/.ssh, or the spec's slurm.login); the nodes through Slurm"


def check(timeout: float) -> ProviderCheck:
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return ProviderCheck("slurm", False, "no sinfo here: this machine is not a Slurm login node", fix=FIX,
                             ssh_key=KEY)
    where = f"{sinfo}" + (f", SLURM_CONF {os.environ['SLURM_CONF']}" if os.environ.get("SLURM_CONF") else "")
    try:
        p = subprocess.run([sinfo, "-h", "-N", "-o", "%N|%P|%G"], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return ProviderCheck("slurm", False, f"sinfo: no answer in {timeout:g} s (is slurmctld up?)",
                             fix="scontrol ping", credentials=where, ssh_key=KEY)
    except OSError as e:
        return ProviderCheck("slurm", False, f"sinfo: {e}", fix=FIX, credentials=where, ssh_key=KEY)
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1][:200].removeprefix("sinfo: ")
        if "configuration source" in why:
            return ProviderCheck("slurm", False, "sinfo is here, but no Slurm cluster is configured (SLURM_CONF, "
                                 "/etc/slurm/slurm.conf)", fix=FIX, credentials=where, ssh_key=KEY)
        return ProviderCheck("slurm", False, f"sinfo: {why}", fix="scontrol ping  (is slurmctld up, SLURM_CONF right?)",
                             credentials=where, ssh_key=KEY)
    rows = [ln.split("|") for ln in p.stdout.splitlines() if ln.count("|") == 2]
    parts = sorted({r[1].rstrip("*") for r in rows})
    gres = {r[0]: r[2] for r in rows}  # a node in two partitions counts once
    gpus = sum(int(m.group(1)) for g in gres.values() for m in re.finditer(r"gpu(?::[^:,(]+)?:(\d+)", g))
    call = f"sinfo: {len(parts)} partitions ({', '.join(parts[:6])})"
    return ProviderCheck("slurm", True, f"partitions {', '.join(parts[:6]) or 'none'}", credentials=where,
                         call=call, quota=f"{gpus} GPUs (GRES) on {len(gres)} nodes", ssh_key=KEY)
