"""What runs on each node beside the job (stdlib + the sync engine, from ``gtrain-ckpt.pyz``)::

    python3 gtrain-ckpt.pyz probe   STORE KEY NODE
    python3 gtrain-ckpt.pyz fresh   STORE KEY NODE                          --fresh: the run starts over
    python3 gtrain-ckpt.pyz restore STORE KEY NODE CKPT_DIR JOB_DIR      one JSON line: resume_from, ...
    python3 gtrain-ckpt.pyz agent   STORE KEY NODE CKPT_DIR JOB_DIR ATTEMPT
    python3 gtrain-ckpt.pyz flush   STORE KEY NODE CKPT_DIR JOB_DIR ATTEMPT RC

KEY is the run's folder in the store (``<cluster>/<run-id>``; a job id for jobs launched before runs).

``agent`` is the uploader (every ``GTRAIN_CHECKPOINT_POLL_S``, default 2 s, it uploads the checkpoints of
CKPT_DIR that are complete: ``<name>.done`` exists; a single file no process holds open (a completed write,
copied to a snapshot first, so a file rewritten every second still goes up); a folder whose every file is
closed and unchanged for ``GTRAIN_CHECKPOINT_SETTLE_S``, default 10 s) and the interruption-notice watcher (EC2 spot
``/latest/meta-data/spot/instance-action`` over IMDSv2, GCE ``/computeMetadata/v1/instance/preempted``, Azure's
``Preempt`` scheduled event; endpoints ``GTRAIN_IMDS_ENDPOINT`` / ``GTRAIN_GCE_METADATA_ENDPOINT`` /
``GTRAIN_AZURE_IMDS_ENDPOINT``): on a notice each rank process that
handles SIGUSR1 gets one. SIGTERM (a cancel) makes it upload what is complete and exit. ``flush`` is the
final pass after the launcher ended (RC 0: every closed file counts as complete; any other RC, and a recovery's
collect after the stop, first wait out the settle time of the folders written last, at most
``GTRAIN_CHECKPOINT_SETTLE_S``: the ranks are gone, so those are uploaded rather than left behind).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from gtrain.checkpoints.sharded import FRAMEWORK_DOTFILES, dcp_finished, describe
from gtrain.checkpoints.store import META_DIR, Store, pointer_target
from gtrain.checkpoints.subset import restore_mode
from gtrain.errors import GtrainError, SyncError

DONE_SUFFIX = ".done"
_SKIP_PREFIXES = (".", "_tmp")


def _say(msg: str) -> None:
    print(f"[gtrain ckpt] {msg}", flush=True)


def entries(root: Path) -> dict[str, list[str]]:
    """Checkpoint name -> its files (relative to root); markers and hidden / temp files left out, but not the
    dot-files a framework writes as part of a checkpoint folder (DCP's ``.metadata``)."""
    out: dict[str, list[str]] = {}
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return out
    for name in names:
        if name.startswith(_SKIP_PREFIXES) or name.endswith((DONE_SUFFIX, ".tmp", ".partial")) or name == META_DIR:
            continue
        p = root / name
        if p.is_file():
            out[name] = [name]
        elif p.is_dir():
            files = [str(f.relative_to(root)) for f in sorted(p.rglob("*"))
                     if f.is_file() and (not f.name.startswith(".") or f.name in FRAMEWORK_DOTFILES)
                     and not f.name.endswith((".tmp", ".partial"))]
            if files:
                out[name] = files
    return out


def open_files() -> set[str]:
    """Every path some process on this machine holds open (those we may read: ours, at least)."""
    held: set[str] = set()
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not pid.isdigit():
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            for fd in os.listdir(fd_dir):
                try:
                    held.add(os.readlink(f"{fd_dir}/{fd}"))
                except OSError:
                    pass
        except OSError:
            pass
    return held


def complete(root: Path, name: str, files: list[str], *, settle_s: float, final: bool) -> bool:
    """Marked done; else a single file (``ckpt.pt``, maybe rewritten in place every second) once no process
    holds it open: a completed write, snapshotted before upload; else (a folder, written file by file)
    (``final``: the job is over and succeeded) closed, else closed and unchanged for ``settle_s``; a DCP folder
    whose ``.metadata`` (written last, once every rank finished) is newer than its other files: closed."""
    if (root / f"{name}{DONE_SUFFIX}").exists():
        return True
    if files == [name] or dcp_finished(root, name, files):
        final = True
    now = time.time()
    try:
        newest = max((root / f).stat().st_mtime for f in files)
    except OSError:
        return False
    if not final and now - newest < settle_s:
        return False
    held = open_files()
    return not any(os.path.realpath(root / f) in held for f in files)


def signature(root: Path, files: list[str]) -> list[list[object]]:
    out: list[list[object]] = []
    for f in files:
        st = (root / f).stat()
        out.append([f, st.st_size, st.st_mtime_ns])
    return out


class Uploader:
    def __init__(self, store: Store, node: int, root: Path, job_dir: Path, attempt: int) -> None:
        self.store, self.node, self.root, self.job_dir, self.attempt = store, node, root, job_dir, attempt
        self.settle_s = float(os.environ.get("GTRAIN_CHECKPOINT_SETTLE_S", "10"))
        self.done_path = job_dir / "ckpt-done.json"  # name -> signature uploaded; kept across attempts
        self.done: dict[str, list[list[object]]] = dict(_read_json(self.done_path) or {})  # type: ignore[arg-type]
        restored = _read_json(job_dir / "ckpt-restored.json")
        if restored and restored.get("name"):  # what restore put here is in the store already
            name = str(restored["name"])
            files = entries(root).get(name)
            if files:
                self.done[name] = signature(root, files)

    def skip_stored(self) -> None:
        """What checkpoint_dir holds that the store has already (an earlier launch of the run uploaded it, or
        restore put it here): by path, size and write time against every node's manifest. Not uploaded again."""
        stored: dict[str, tuple[int, float]] = {}
        try:
            for ckpt in self.store.checkpoints():
                for m in ckpt.manifests.values():
                    for f in m["files"]:
                        stored[str(f["path"])] = (int(f["size"]), float(f.get("mtime") or -1))
        except (GtrainError, OSError, KeyError, TypeError, ValueError):
            return
        for name, files in entries(self.root).items():
            if name in self.done:
                continue
            try:
                sig = signature(self.root, files)
            except OSError:
                continue
            if all(str(f) in stored and stored[str(f)][0] == size and abs(stored[str(f)][1] - int(str(ns)) / 1e9) < 1e-3
                   for f, size, ns in sig):
                self.done[name] = sig

    def _snapshot(self, name: str, sig: list[list[object]]) -> Path | None:
        """A copy of the single-file checkpoint ``name`` as its last completed write left it (its mtime kept),
        under JOB_DIR/ckpt-snapshot; None when the file changed or was reopened while it was copied (a
        half-written version is never uploaded). The upload reads the copy, so the job may rewrite the
        original meanwhile."""
        snap = self.job_dir / "ckpt-snapshot"
        shutil.rmtree(snap, ignore_errors=True)
        snap.mkdir(parents=True)
        shutil.copy2(self.root / name, snap / name)
        held = open_files()
        if signature(self.root, [name]) != sig or os.path.realpath(self.root / name) in held:
            return None
        return snap

    def settle(self) -> float:
        """Wait until the step folders not yet uploaded have been unchanged for the settle time (at most that
        long), for the flush after a stop: the ranks are gone, so what they wrote last is as whole as it will
        get; skipping it as "still being written" would leave the newest checkpoint behind (issue 27).
        Returns the seconds waited."""
        newest = 0.0
        for name, files in entries(self.root).items():
            try:
                if files != [name] and self.done.get(name) != signature(self.root, files):
                    newest = max(newest, *((self.root / f).stat().st_mtime for f in files))
            except OSError:
                continue
        wait = min(self.settle_s, newest + self.settle_s - time.time())
        if wait > 0:
            time.sleep(wait)
        return max(0.0, wait)

    def one_pass(self, *, final: bool = False) -> int:
        n = 0
        for name, files in entries(self.root).items():
            try:
                sig = signature(self.root, files)
            except OSError:
                continue  # removed under us
            if self.done.get(name) == sig or not complete(self.root, name, files, settle_s=self.settle_s,
                                                          final=final):
                continue
            t0 = time.monotonic()
            try:
                src = self._snapshot(name, sig) if files == [name] else self.root
                if src is None:
                    continue  # rewritten while it was copied: the next pass takes the next completed write
                steps = {n for n, fs in entries(self.root).items() if fs != [n]}
                points_to = pointer_target(src / name, steps) if files == [name] else None
                doc = self.store.upload(self.node, src, name, files, attempt=self.attempt, points_to=points_to,
                                        extra=describe(src, name, files) if files != [name] else None)
            except (GtrainError, OSError) as e:
                _say(f"upload of {name} failed (retried next pass): {getattr(e, 'message', e)}")
                continue
            finally:
                shutil.rmtree(self.job_dir / "ckpt-snapshot", ignore_errors=True)
            self.done[name] = sig
            tmp = self.done_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.done))
            os.replace(tmp, self.done_path)
            n += 1
            size = sum(f["size"] for f in doc["files"])
            _say(f"uploaded {name} ({len(files)} file(s), {size} bytes, {time.monotonic() - t0:.2f}s) "
                 f"-> {self.store.where}/node-{self.node}/")
            with open(self.job_dir / "ckpt-uploads.jsonl", "a") as f:
                f.write(json.dumps({"name": name, "bytes": size, "at": time.time()}) + "\n")
        return n


def _read_json(path: Path) -> dict[str, object] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


# ---- interruption notices ------------------------------------------------------------------------


def _get(url: str, headers: dict[str, str], method: str = "GET", timeout: float = 1.0) -> tuple[int, str]:
    import urllib.error
    import urllib.request  # here: a restore (the command every node runs before the script) does not need it

    req = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - metadata endpoints only
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        e.close()
        return e.code, ""


def aws_notice(base: str) -> str | None:
    """The EC2 spot interruption notice (IMDSv2), or None."""
    _, token = _get(f"{base}/latest/api/token", {"X-aws-ec2-metadata-token-ttl-seconds": "300"}, "PUT")
    code, body = _get(f"{base}/latest/meta-data/spot/instance-action",
                      {"X-aws-ec2-metadata-token": token} if token else {})
    return (body.strip() or "spot interruption") if code == 200 else None


def gce_notice(base: str) -> str | None:
    code, body = _get(f"{base}/computeMetadata/v1/instance/preempted", {"Metadata-Flavor": "Google"})
    return "GCE preemption" if code == 200 and body.strip().upper() == "TRUE" else None


def azure_notice(base: str) -> str | None:
    """An Azure Spot eviction: a ``Preempt`` scheduled event (IMDS /metadata/scheduledevents, header Metadata:
    true; https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events) naming this VM, or None."""
    code, body = _get(f"{base}/metadata/scheduledevents?api-version=2020-07-01", {"Metadata": "true"})
    if code != 200:
        return None
    try:
        events = [e for e in json.loads(body).get("Events") or [] if e.get("EventType") == "Preempt"]
    except (ValueError, AttributeError):
        return None
    if not events:
        return None
    code, me = _get(f"{base}/metadata/instance/compute/name?api-version=2021-02-01&format=text", {"Metadata": "true"})
    mine = [e for e in events if code != 200 or not e.get("Resources") or me.strip() in e["Resources"]]
    return f"Azure Spot eviction (Preempt, not before {mine[0].get('NotBefore') or '?'})" if mine else None


def rank_pids(job_id: str) -> list[int]:
    """This job's training processes (not the shells or torchrun's agent) that handle SIGUSR1."""
    out = []
    needle = f"GTRAIN_JOB_ID={job_id}".encode()
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if needle not in env or not any(e.startswith(b"LOCAL_RANK=") for e in env) or comm in ("bash", "sh", "dash"):
            continue
        caught = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
        if caught & (1 << (signal.SIGUSR1 - 1)):
            out.append(int(pid))
    return out


def watch_notices(job_id: str, stop: threading.Event, poll_s: float = 5.0) -> None:
    checks = []
    if base := os.environ.get("GTRAIN_IMDS_ENDPOINT", "http://169.254.169.254"):
        checks.append((aws_notice, base.rstrip("/")))
    if base := os.environ.get("GTRAIN_GCE_METADATA_ENDPOINT", "http://metadata.google.internal"):
        checks.append((gce_notice, base.rstrip("/")))
    if base := os.environ.get("GTRAIN_AZURE_IMDS_ENDPOINT", os.environ.get("GTRAIN_IMDS_ENDPOINT", "http://169.254.169.254")):
        checks.append((azure_notice, base.rstrip("/")))
    poll_s = float(os.environ.get("GTRAIN_NOTICE_POLL_S", poll_s))
    while checks and not stop.is_set():
        for check in list(checks):
            try:
                why = check[0](check[1])
            except OSError:  # no such metadata server here: not this cloud
                checks.remove(check)
                continue
            if why:
                pids = rank_pids(job_id)
                _say(f"interruption notice ({why}): SIGUSR1 to rank process(es) {pids}")
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGUSR1)
                    except OSError:
                        pass
                return
        stop.wait(poll_s)


# ---- commands ------------------------------------------------------------------------------------


def cmd_restore(store: Store, node: int, root: Path, job_dir: Path, only: str | None = None,
                env: Mapping[str, str] | None = None) -> dict[str, object]:
    """Restore the newest complete checkpoint (``only``: that one; ``-``: none) into ``root``: the whole step, or
    (``GTRAIN_CHECKPOINT_RESTORE=subset`` in ``env``, default ``os.environ``) what this node's ranks read
    (:func:`restore_mode`)."""
    t0 = time.monotonic()
    skipped: list[tuple[str, str]] = []
    got: list[str] = []
    kept: list[str] = []
    ckpt, nbytes = None, 0
    chose: dict[str, object] = {}
    if only != "-":
        ckpt, got, kept, nbytes = store.restore_newest(
            root, skip=skipped, only=only, select=restore_mode(store, node, os.environ if env is None else env, chose))
        if only is not None and ckpt is None:
            raise SyncError(f"checkpoint {only} (the one this elastic round resumes from) cannot be restored from "
                            f"{store.where}" + (f": {skipped[0][1]}" if skipped else ""))
    for name, why in skipped:  # stderr: stdout is the one JSON document the node script reads
        print(f"[gtrain ckpt] checkpoint {name} refused, not restored: {why}", file=sys.stderr, flush=True)
    if ckpt is None:
        doc: dict[str, object] = {"resume_from": "", "name": None, "files": 0, "bytes": 0}
    else:
        doc = {"resume_from": str(root / ckpt.name), "name": ckpt.name, "files": len(got), "kept": len(kept),
               "bytes": nbytes, "mode": chose.get("mode", "whole"), "why": chose.get("why", ""),
               "conflicts": store.conflicts, "pointers": store.pointed,
               "set_aside": set_aside_partial(store, root, ckpt.name)}
        for c in store.conflicts:
            print(f"gtrain-ckpt: restore conflict: {c}", file=sys.stderr, flush=True)
        for name in doc["set_aside"]:  # type: ignore[attr-defined]
            print(f"[gtrain ckpt] {name}: not whole in the store (a node's part never reached it), set aside in "
                  f"{PARTIAL}/ (newer than {ckpt.name}, restored)", file=sys.stderr, flush=True)
    if skipped:
        doc["skipped"] = [{"name": n, "why": w} for n, w in skipped]
    doc["seconds"] = round(time.monotonic() - t0, 3)
    (job_dir / "ckpt-restored.json").write_text(json.dumps(doc))
    return doc


PARTIAL = ".gtrain-partial"  # under checkpoint_dir: hidden, so neither a trainer nor the uploader takes it


def _series(name: str) -> tuple[str, int] | None:
    """A step folder's series and number: ``checkpoint-12`` -> ("checkpoint-", 12), ``global_step4`` ->
    ("global_step", 4); None for a name that ends in no number."""
    m = re.fullmatch(r"(.*?)(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else None


def set_aside_partial(store: Store, root: Path, restored: str) -> list[str]:
    """Move the step folders of this node that the store holds only in part (a node slower to write had not
    written its part) or not at all (a newer step of the restored one's series whose upload never happened)
    and that are newer than the checkpoint restored into ``root/.gtrain-partial/``: a
    trainer that resumes from the highest-numbered folder (Hugging Face's ``get_last_checkpoint``) then finds
    the one restored, never a partial one. Nothing is deleted. Returns their names."""
    try:
        since = max(os.stat(root / f).st_mtime for f in entries(root).get(restored, []))
    except (OSError, ValueError):
        return []
    out = []
    # beside what the store holds in part: a newer step of the same series the store does not hold at all (the
    # node wrote it, its upload never happened): a trainer taking the highest number would resume from it
    series = _series(restored)
    listed = {c.name for c in store.listing}
    unstored = [n for n in entries(root) if n not in listed and series is not None
                and (k := _series(n)) is not None and k[0] == series[0] and k[1] > series[1]]
    for name in [*(c.name for c in store.listing if not c.complete), *unstored]:
        path = root / name
        if name == restored or not path.is_dir() or path.is_symlink():
            continue
        files = entries(root).get(name) or []
        try:
            if not files or max(os.stat(root / f).st_mtime for f in files) <= since:
                continue
            dest = root / PARTIAL / f"{name}-{int(time.time())}"
            dest.parent.mkdir(exist_ok=True)
            os.replace(path, dest)
            marker = root / f"{name}{DONE_SUFFIX}"
            if marker.exists():
                os.replace(marker, dest.with_name(dest.name + DONE_SUFFIX))
        except OSError:
            continue
        out.append(name)
    return out


def cmd_agent(store: Store, job_id: str, node: int, root: Path, job_dir: Path, attempt: int) -> None:
    up = Uploader(store, node, root, job_dir, attempt)
    up.skip_stored()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    job_id = os.environ.get("GTRAIN_JOB_ID") or job_id  # the store key is the run's; the ranks carry the job's
    threading.Thread(target=watch_notices, args=(job_id, stop), daemon=True).start()
    poll = float(os.environ.get("GTRAIN_CHECKPOINT_POLL_S", "2"))
    while not stop.is_set() and not (job_dir / "ckpt-stop").exists():
        up.one_pass()
        stop.wait(poll)
    up.one_pass()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    cmd, store_url, job_id, node = args[0], args[1], args[2], int(args[3])
    try:
        store = Store(store_url, job_id)
        if cmd == "probe":
            store.probe(node)
            print(json.dumps({"ok": True}))
        elif cmd == "fresh":
            print(json.dumps({"since": store.mark_fresh()}))
        elif cmd == "restore":
            only = args[6] if len(args) > 6 else None  # an elastic round's agreed step
            print(json.dumps(cmd_restore(store, node, Path(args[4]), Path(args[5]), only)))
        elif cmd == "agent":
            cmd_agent(store, job_id, node, Path(args[4]), Path(args[5]), int(args[6]))
        elif cmd == "flush":
            up = Uploader(store, node, Path(args[4]), Path(args[5]), int(args[6]))
            n = up.one_pass(final=args[7] == "0")
            # stopped or failed: what was written last is waited for (after what had settled went up, in case
            # the wait is cut short), not left behind
            if args[7] != "0" and up.settle() > 0:
                n += up.one_pass()
            _say(f"final flush: {n} checkpoint(s) uploaded")
            print(json.dumps({"uploaded": n}))
        store.close()
    except GtrainError as e:
        print(json.dumps({"error": e.message, "hint": e.hint}))
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
