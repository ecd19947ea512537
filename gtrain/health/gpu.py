"""``nvidia-smi --query-gpu=… --format=csv`` parsed (the header names the columns and their units), and the
GPU checks of one node and across nodes. The rules (docs/health.md has the table):

- ``gpu.count``: fewer or more GPUs than ``resources.accelerators`` asks, or another model: fail.
- ``gpu.ecc``: a volatile (since the last reset) uncorrectable error: fail; only aggregate (lifetime) ones: warn.
- ``gpu.pages``: remapping failed, or 60+ retired pages (NVIDIA's replace-the-board line): fail; a pending
  retirement/remap (applies at the next reset): warn.
- ``gpu.xid``: Xid 48/63/64/74/79/94/95 since boot: fail; any other Xid: warn; kernel log unreadable: unknown.
- ``gpu.throttle``: hardware slowdown, thermal or power-brake throttling active: warn.
- ``gpu.persistence``: persistence mode off: warn.
- ``gpu.versions`` (cluster): driver or CUDA versions that differ between nodes: warn.
"""

from __future__ import annotations

import csv
import re
from typing import Any

from gtrain.health.model import Check, Verdict

_MISSING = {"", "[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "[insufficient permissions]"}
_UNIT = re.compile(r"\s*\[[^\]]*\]$")
_VALUE_UNIT = re.compile(r"^(-?[0-9.]+)\s*(MiB|W|%|MHz|C)$")
#: Xids that mean the GPU (or its memory, or its link) is not fit to train on
FATAL_XIDS = {48: "double-bit ECC error", 63: "row-remapping event", 64: "row-remapping failure",
              74: "NVLink error", 79: "GPU fell off the bus", 94: "contained ECC error", 95: "uncontained ECC error"}
#: clocks_throttle_reasons.active bits worth a warning (idle, app clocks and the power cap are not)
THROTTLE_BITS = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
                 0x80: "HW power brake"}
RETIRED_PAGES_LIMIT = 60
#: other spellings of a field, as headers of other driver versions print them -> the name used here
ALIASES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active",
           "retired_pages.sbe": "retired_pages.single_bit_ecc.count",
           "retired_pages.dbe": "retired_pages.double_bit.count", "gpu_name": "name", "gpu_serial": "serial",
           "gpu_uuid": "uuid"}


def parse_csv(text: str) -> list[dict[str, str | None]]:
    """Rows of ``--format=csv`` output keyed by field name (units dropped from header and values; ``[N/A]``
    and ``[Not Supported]`` become None)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    reader = csv.reader(lines, skipinitialspace=True)
    header = [ALIASES.get(k, k) for k in (_UNIT.sub("", h.strip()) for h in next(reader))]
    rows = []
    for cells in reader:
        if len(cells) != len(header):
            continue  # a warning line of nvidia-smi's own, not a GPU
        row: dict[str, str | None] = {}
        for key, cell in zip(header, cells, strict=True):
            v = cell.strip()
            m = _VALUE_UNIT.match(v)
            # every bracketed value is nvidia-smi's word for "no value": [N/A], [Not Supported], [Unknown Error],
            # [GPU requires reset], [Requested functionality has been deprecated] (590 on H100), ...
            missing = v.lower() in _MISSING or (v.startswith("[") and v.endswith("]"))
            row[key] = None if missing else (m.group(1) if m else v)
        rows.append(row)
    return rows


def _int(v: str | None) -> int | None:
    if v is None:
        return None
    try:
        return int(v, 16) if v.lower().startswith("0x") else int(float(v))
    except ValueError:
        return None


def model_matches(spec_name: str, smi_name: str) -> bool:
    """``A100`` matches ``NVIDIA A100-SXM4-40GB``, ``A100-80GB`` matches ``NVIDIA A100-SXM4-80GB``, ``T4``
    matches ``Tesla T4``; ``L4`` does not match ``NVIDIA L40S``: every part of the spec's name is a part of
    the GPU's."""
    have = {t for t in re.split(r"[\s\-_]+", smi_name.upper()) if t}
    return all(t in have for t in re.split(r"[\s\-_]+", spec_name.upper()) if t)


def gpu_rows(probe: dict[str, Any]) -> list[dict[str, str | None]]:
    gpu = probe.get("gpu") or {}
    return parse_csv(str(gpu.get("csv") or "")) if gpu.get("present") and gpu.get("rc") == 0 else []


def _gpu_label(row: dict[str, str | None]) -> str:
    return f"GPU {row.get('index')}" + (f" (serial {row['serial']})" if row.get("serial") else "")


def node_checks(node: int, probe: dict[str, Any], want_name: str | None, want_count: int) -> list[Check]:
    """The GPU checks of one node from its ``nodeprobe.health`` answer."""
    gpu = probe.get("gpu") or {}
    if not gpu.get("present"):
        if want_count == 0:
            return [Check("gpu.count", Verdict.SKIPPED, "no GPU", "the spec asks for none and the node has none",
                          node)]
        return [Check("gpu.count", Verdict.FAIL, f"0/{want_count} {want_name}",
                      f"spec asks {want_name}:{want_count}; no nvidia-smi on the node (no NVIDIA driver)", node)]
    if gpu.get("rc") != 0:
        err = str(gpu.get("stderr") or gpu.get("csv") or "").strip().splitlines()
        return [Check("gpu.count", Verdict.FAIL, "nvidia-smi failed",
                      f"nvidia-smi exit {gpu.get('rc')}: {err[-1] if err else 'no output'}", node)]
    rows = gpu_rows(probe)
    names = sorted({str(r.get("name")) for r in rows})
    found = f"{len(rows)}x {', '.join(names) or '?'}"
    out: list[Check] = []
    if want_count and len(rows) != want_count:
        out.append(Check("gpu.count", Verdict.FAIL, f"{len(rows)}/{want_count}",
                         f"spec asks {want_name}:{want_count}, nvidia-smi lists {len(rows)} GPU(s) ({found})", node))
    elif want_name and not all(model_matches(want_name, n) for n in names):
        out.append(Check("gpu.count", Verdict.FAIL, found, f"spec asks {want_name}:{want_count}, the node has "
                         f"{found}", node))
    else:
        asked = f"spec asks {want_name}:{want_count}" if want_count else "spec asks none"
        out.append(Check("gpu.count", Verdict.OK, f"{len(rows)}/{want_count or len(rows)}", f"{found}; {asked}",
                         node))
    out += [_ecc(node, rows), _pages(node, rows), _xid(node, probe.get("xid")), _throttle(node, rows),
            _persistence(node, rows)]
    return out


def _ecc(node: int, rows: list[dict[str, str | None]]) -> Check:
    vol = {_gpu_label(r): n for r in rows if (n := _int(r.get("ecc.errors.uncorrected.volatile.total")))}
    agg = {_gpu_label(r): n for r in rows if (n := _int(r.get("ecc.errors.uncorrected.aggregate.total")))}
    if vol:
        return Check("gpu.ecc", Verdict.FAIL, f"{sum(vol.values())} uncorrectable (volatile)",
                     "uncorrectable ECC errors since the last reset on " + ", ".join(f"{k}: {v}" for k, v in
                                                                                     vol.items()), node)
    if agg:
        return Check("gpu.ecc", Verdict.WARN, f"{sum(agg.values())} uncorrectable (aggregate)",
                     "uncorrectable ECC errors in the GPU's lifetime on " + ", ".join(f"{k}: {v}" for k, v in
                                                                                      agg.items()), node)
    off = [_gpu_label(r) for r in rows if (r.get("ecc.mode.current") or "").lower() == "disabled"]
    if off:
        return Check("gpu.ecc", Verdict.WARN, "ECC off", f"ECC is disabled on {', '.join(off)}", node)
    known = any(r.get("ecc.errors.uncorrected.volatile.total") is not None for r in rows)
    return Check("gpu.ecc", Verdict.OK, "0 uncorrectable" if known else "not reported",
                 "no uncorrectable ECC errors" if known else "this GPU reports no ECC counters", node)


def _pages(node: int, rows: list[dict[str, str | None]]) -> Check:
    failed = [_gpu_label(r) for r in rows if (r.get("remapped_rows.failure") or "").lower() == "yes"]
    retired = {_gpu_label(r): (_int(r.get("retired_pages.single_bit_ecc.count")) or 0)
               + (_int(r.get("retired_pages.double_bit.count")) or 0)
               for r in rows}
    worst = max(retired.values(), default=0)
    if failed:
        return Check("gpu.pages", Verdict.FAIL, "row remapping failed", f"row remapping failed on {', '.join(failed)}"
                     " (replace the GPU)", node)
    if worst >= RETIRED_PAGES_LIMIT:
        bad = [k for k, v in retired.items() if v >= RETIRED_PAGES_LIMIT]
        return Check("gpu.pages", Verdict.FAIL, f"{worst} retired pages", f"{', '.join(bad)}: {worst} retired pages "
                     f"(>= {RETIRED_PAGES_LIMIT}: replace the GPU)", node)
    pending = [_gpu_label(r) for r in rows if "yes" in ((r.get("retired_pages.pending") or "").lower(),
                                                          (r.get("remapped_rows.pending") or "").lower())]
    if pending:
        return Check("gpu.pages", Verdict.WARN, "pending", f"page retirement / row remap pending on "
                     f"{', '.join(pending)}: reset the GPU (or reboot) to apply it", node)
    return Check("gpu.pages", Verdict.OK, f"{sum(retired.values())} retired", "no pending or failed page "
                 "retirement or row remap", node)


def _xid(node: int, xid: dict[str, Any] | None) -> Check:
    if not xid or not xid.get("readable"):
        return Check("gpu.xid", Verdict.SKIPPED, "unknown", "kernel log not readable here (dmesg/journal need "
                     "privileges); Xid errors unknown", node)
    lines = [str(x) for x in xid.get("lines") or []]
    count = int(xid.get("count") or 0)
    if not count:
        return Check("gpu.xid", Verdict.OK, "0 Xid", f"no NVIDIA Xid errors since boot ({xid.get('source')})", node)
    codes = [int(m.group(1)) for ln in lines if (m := re.search(r"Xid \([^)]*\): (\d+)", ln))]
    fatal = sorted({c for c in codes if c in FATAL_XIDS})
    last = lines[-1][-160:] if lines else ""
    if fatal:
        return Check("gpu.xid", Verdict.FAIL, f"{count} Xid", "Xid " + ", ".join(f"{c} ({FATAL_XIDS[c]})" for c in
                                                                                 fatal) + f": {last}", node)
    return Check("gpu.xid", Verdict.WARN, f"{count} Xid", f"{count} Xid error(s) since boot: {last}", node)


def _throttle(node: int, rows: list[dict[str, str | None]]) -> Check:
    found = []
    for r in rows:
        mask = _int(r.get("clocks_throttle_reasons.active")) or 0
        why = [name for bit, name in THROTTLE_BITS.items() if mask & bit]
        if why:
            found.append(f"{_gpu_label(r)}: {', '.join(why)}")
    if found:
        return Check("gpu.throttle", Verdict.WARN, f"{len(found)} throttled", "; ".join(found), node)
    return Check("gpu.throttle", Verdict.OK, "0 throttled", "no thermal, power-brake or HW slowdown", node)


def _persistence(node: int, rows: list[dict[str, str | None]]) -> Check:
    off = [str(r.get("index")) for r in rows if (r.get("persistence_mode") or "").lower() == "disabled"]
    if off:
        return Check("gpu.persistence", Verdict.WARN, f"off on {len(off)}", f"persistence mode is off on GPU(s) "
                     f"{', '.join(off)}: `sudo nvidia-smi -pm 1` (driver re-init at each start otherwise)", node)
    return Check("gpu.persistence", Verdict.OK, "on", "persistence mode on" if rows else "no GPUs", node)


def version_check(probes: dict[int, dict[str, Any]]) -> Check | None:
    """Driver and CUDA versions identical across the nodes that have GPUs (None: no node has one)."""
    drivers: dict[str, list[int]] = {}
    cudas: dict[str, list[int]] = {}
    for node, p in sorted(probes.items()):
        rows = gpu_rows(p)
        if not rows:
            continue
        for d in {str(r.get("driver_version")) for r in rows}:
            drivers.setdefault(d, []).append(node)
        cudas.setdefault(str((p.get("gpu") or {}).get("cuda")), []).append(node)
    if not drivers:
        return None
    figure = f"driver {'/'.join(sorted(drivers))}, CUDA {'/'.join(sorted(cudas))}"
    if len(drivers) > 1 or len(cudas) > 1:
        spread = "; ".join(f"{what} {v} on node(s) {','.join(map(str, ns))}" for what, m in
                           (("driver", drivers), ("CUDA", cudas)) if len(m) > 1 for v, ns in sorted(m.items()))
        return Check("gpu.versions", Verdict.WARN, figure, f"versions differ between nodes: {spread}")
    return Check("gpu.versions", Verdict.OK, figure, "the same driver and CUDA version on every node")


def serial_of(probe: dict[str, Any], index: int | None, uuid: str | None) -> str | None:
    """The serial of a node's GPU, found by UUID (what torch reports) or else by index."""
    for r in gpu_rows(probe):
        if (uuid and r.get("uuid") and str(r["uuid"]).removeprefix("GPU-") == uuid.removeprefix("GPU-")) or \
                (not uuid and index is not None and _int(r.get("index")) == index):
            return r.get("serial")
    return None
