"""The node's own sender (docs/notify.md, "Sent when nobody follows"): rank 0's watcher on a cloud node sends
``idle_stopped`` (``policies.idle_minutes`` is about to power the node off), ``budget_80`` and
``budget_reached`` (80% of the node's lifetime from ``policies.max_hours`` / ``max_cost_usd`` has passed; the
lifetime is about to end) itself, so a closed laptop still gets them.

Stdlib only: this file runs ON the node, which has python3, not gtrain. It is started by
:func:`gtrain.notify.nodestart.start` as ``python3 -c BOOT`` with ONE line of JSON on its standard input (over
the SSH session that starts it): the watcher's settings, the sources it runs (this file, ``nodeside``, and
gtrain's own ``notify.message`` / ``notify.deliver``, so the payloads and retries are the same code as the
laptop's) and the secrets (the webhook URL, the SMTP URL). The secrets are read once into memory and kept
nowhere else: not in argv, the environment, a file or the log (every line printed is masked). A reboot ends
the watcher; ``gtrain start`` starts a new one with the secrets sent again.

One event, one message: before sending, the watcher claims the event with a marker file created exclusively
under ``<node root>/notify/<cluster>/``; the laptop's senders claim the same marker over SSH
(:func:`claim`, run as ``python3 - claim DIR KEY``) before they send, so whichever comes first sends."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

#: the watcher's ``python3 -c`` program: read the one JSON line, install the shipped modules, run
BOOT = ("import json,sys,types\n"
        "cfg=json.loads(sys.stdin.buffer.readline())\n"
        "sys.stdin.close()\n"
        "for name,src in cfg.pop('sources'):\n"
        "    m=types.ModuleType(name);m.__dict__['__file__']='<gtrain '+name+'>';sys.modules[name]=m\n"
        "    p,_,leaf=name.rpartition('.')\n"
        "    if p: setattr(sys.modules[p],leaf,m)\n"
        "    if src is not None: exec(compile(src,'<gtrain '+name+'>','exec'),m.__dict__)\n"
        "sys.exit(sys.modules['gtrain.notify.nodewatch'].main(cfg))\n")
#: ``budget_reached`` goes this long before the node's lifetime ends (it powers off then)
REACHED_LEAD_S = 60.0
NODE_EVENTS = ("budget_80", "budget_reached", "idle_stopped")


class Redact:
    """The node's stand-in for :mod:`gtrain.redact` (installed as it): the values given are masked."""

    MASK = "***"

    def __init__(self) -> None:
        self.values: set[str] = set()

    def register(self, value: str) -> None:
        import urllib.parse

        if value and len(value) >= 4:
            self.values |= {value, urllib.parse.quote(value, safe=""), json.dumps(value)[1:-1]}

    def scrub(self, text: str) -> str:
        for v in sorted(self.values, key=len, reverse=True):
            text = text.replace(v, self.MASK)
        return text

    def scrub_obj(self, obj: Any) -> Any:
        if isinstance(obj, str):
            return self.scrub(obj)
        if isinstance(obj, list):
            return [self.scrub_obj(x) for x in obj]
        if isinstance(obj, dict):
            return {self.scrub_obj(k): self.scrub_obj(v) for k, v in obj.items()}
        return obj


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as f:
            return f.read().strip()[:8] or "0"
    except OSError:
        return "0"


def marker(root: str, key: str) -> str:
    """``KEY@boot`` is per boot of the node (an idle stop powers it off; after `gtrain start` it may again)."""
    return os.path.join(root, key.replace("@boot", "-" + boot_id()) + ".json")


def claim(root: str, key: str, force: str = "0") -> dict[str, Any]:
    """Create the marker of ``key`` exclusively: ``claimed`` false when another sender has it. ``force``:
    write it whether or not (the laptop's ``idle_stopped`` of a job: the node's own later one is then not sent)."""
    os.makedirs(root, mode=0o700, exist_ok=True)
    path = marker(root, key)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        if force != "1":
            return {"claimed": False, "path": path}
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"claimed_at": time.time(), "by": "node" if __name__ != "__main__" else "gtrain"}, f)
    return {"claimed": True, "path": path}


class Watcher:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.secrets: dict[str, str] = dict(cfg.pop("secrets", None) or {})
        red = sys.modules["gtrain.redact"]
        for v in self.secrets.values():
            red.register(v)  # type: ignore[attr-defined]
            if "://" in v and "@" in v:  # an SMTP URL's password, as deliver.email registers it too
                import urllib.parse

                red.register(urllib.parse.unquote(urllib.parse.urlsplit(v).password or ""))  # type: ignore[attr-defined]
        self.red = red
        self.start = time.time()
        life, ends_in = cfg.get("life_s"), cfg.get("ends_in_s")
        self.life = float(life) if life else None
        self.ends_at = self.start + float(ends_in) if ends_in is not None and self.life else None

    def log(self, line: str) -> None:
        print(self.red.scrub(f"gtrain node watch: {line}"), flush=True)  # type: ignore[attr-defined]

    def send(self, kind: str, key: str, detail: str, cost: float | None = None) -> bool:
        cfg = self.cfg
        if kind not in cfg.get("on", []):
            return False
        got = claim(cfg["marker_dir"], key)
        if not got["claimed"]:
            self.log(f"{kind}: already sent by gtrain ({got['path']}); not sent again")
            return False
        deliver = sys.modules["gtrain.notify.deliver"]
        ev = self.red.scrub_obj({  # type: ignore[attr-defined]
            "event": kind, "t": round(time.time(), 3), "cluster": cfg["cluster"], "job": None,
            "provider": cfg.get("provider"), "state": "sent by the node", "exit_code": None,
            "duration_s": round(time.time() - self.start + float(cfg.get("age_s") or 0), 1),
            "cost_usd": None if cost is None else round(cost, 4), "failed": None, "last_lines": [],
            "report": None, "detail": detail, "links": {}})
        outcomes = []
        hook = cfg.get("webhook")
        if hook and self.secrets.get("webhook"):
            outcomes.append(deliver.webhook(self.secrets["webhook"], hook["format"], ev))  # type: ignore[attr-defined]
        mail = cfg.get("email")
        if mail and self.secrets.get("smtp"):
            outcomes.append(deliver.email(self.secrets["smtp"], mail["sender"], mail["to"], ev))  # type: ignore[attr-defined]
        done = [{"target": o.target, "ok": o.ok, "tries": o.tries, "detail": o.detail} for o in outcomes]
        with open(got["path"], "w", encoding="utf-8") as f:
            json.dump({"event": kind, "sent_at": time.time(), "by": "node", "outcomes": done}, f)
        for o in done:
            self.log(f"{kind}: {o['target']}: {'delivered' if o['ok'] else 'NOT delivered'} after {o['tries']} "
                     f"tr{'y' if o['tries'] == 1 else 'ies'} ({o['detail']})")
        return True

    def budget(self, now: float) -> bool:
        """Send what the lifetime asks for now; True while there is more to wait for."""
        if self.ends_at is None or self.life is None:
            return False
        rate = float(self.cfg.get("usd_per_h") or 0) or None
        spent = self.life - (self.ends_at - now)
        cost = None if rate is None else rate * max(0.0, spent) / 3600
        if not self.cfg.get("_80") and now >= self.ends_at - 0.2 * self.life:
            self.cfg["_80"] = True
            self.send("budget_80", "budget_80", f"80% of the nodes' lifetime ({self.life / 3600:.2f} h, "
                      "policies.max_hours / max_cost_usd) has passed", cost)
        if not self.cfg.get("_reached") and now >= self.ends_at - REACHED_LEAD_S:
            self.cfg["_reached"] = True
            self.send("budget_reached", "budget_reached", f"the nodes' lifetime ({self.life / 3600:.2f} h, "
                      "policies.max_hours / max_cost_usd) ends now: they power off", cost)
        return not self.cfg.get("_reached")

    def run(self) -> int:
        import subprocess

        nodeside = sys.modules["gtrain.remote.nodeside"]
        idle_s, poll = self.cfg.get("idle_s"), float(self.cfg.get("poll_s") or 10)
        cmd = list(self.cfg.get("command") or [])
        self.log(f"events {self.cfg.get('on')}; idle stop after {idle_s}s; lifetime ends in "
                 f"{None if self.ends_at is None else round(self.ends_at - self.start)}s")
        last_busy = time.time()
        while True:
            now = time.time()
            more = self.budget(now)
            if idle_s:
                if nodeside._busy() is not None:  # type: ignore[attr-defined]
                    last_busy = now
                elif now - last_busy >= float(idle_s):
                    self.log(f"idle for {now - last_busy:.0f}s: running {' '.join(cmd)!r}")
                    self.send("idle_stopped", "idle_stopped@boot", f"no job and no SSH login for "
                              f"{now - last_busy:.0f} s (policies.idle_minutes): the node powers off")
                    rc = subprocess.run(cmd, check=False).returncode
                    self.log(f"exit {rc}")
                    return rc
            elif not more:
                return 0
            wait = poll if self.ends_at is None or not more else \
                max(0.2, min(poll, self.ends_at - REACHED_LEAD_S - now))
            time.sleep(wait)


def main(cfg: dict[str, Any]) -> int:
    import fcntl

    sys.modules["gtrain.redact"].__dict__.update(_redact_funcs())
    fd = os.open(os.path.expanduser(cfg["pidfile"]), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # one watcher per node
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return Watcher(cfg).run()


def _redact_funcs() -> dict[str, Any]:
    r = Redact()
    return {"register": r.register, "scrub": r.scrub, "scrub_obj": r.scrub_obj, "MASK": r.MASK}


if __name__ == "__main__":  # python3 - claim DIR KEY [FORCE]: the laptop's side of the markers
    print(json.dumps(claim(*sys.argv[2:])))
