"""Real receivers for the notification tests: a local HTTP server standing in for a webhook (it answers with a
programmed list of status codes, then 200) and an SMTP server (aiosmtpd), each on a free port of 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Hook:
    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.requests: list[dict[str, Any]] = []  # every request: {"status", "body", "path", "headers"}
        self.url = ""

    @property
    def delivered(self) -> list[Any]:
        return [r["body"] for r in self.requests if r["status"] < 300]


@contextmanager
def webhook(statuses: list[int] | None = None, ok_status: int = 200, host: str = "127.0.0.1") -> Iterator[Hook]:
    """``host``: the address to listen on (the sshd hosts' bridge address, for a sender on a node)."""
    hook = Hook(statuses)

    class H(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status = hook.statuses.pop(0) if hook.statuses else ok_status
            hook.requests.append({"status": status, "body": json.loads(body), "path": self.path,
                                  "content_type": self.headers.get("Content-Type")})
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *_: Any) -> None:
            pass

    srv = ThreadingHTTPServer((host, 0), H)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    hook.url = f"http://{host}:{srv.server_address[1]}/hooks/T000/B000/s3cr3t-token"
    try:
        yield hook
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


@contextmanager
def smtp() -> Iterator[tuple[str, list[Any]]]:
    """(smtp URL, the received envelopes)."""
    from aiosmtpd.controller import Controller

    got: list[Any] = []

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
            got.append(envelope)
            return "250 Message accepted for delivery"

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctl = Controller(Handler(), hostname="127.0.0.1", port=port)
    ctl.start()
    try:
        yield f"smtp://127.0.0.1:{port}", got
    finally:
        ctl.stop()
