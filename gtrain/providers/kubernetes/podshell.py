"""`gtrain ssh` into a pod: an interactive shell through the exec API, as ``kubectl exec -it`` opens one.

``python -m gtrain.providers.kubernetes.podshell CONTEXT NAMESPACE POD CMD...`` opens ``pods/exec`` (a websocket
of the ``v5.channel.k8s.io`` subprotocol: channel 0 stdin, 1 stdout, 2 stderr, 3 the exit ``Status``, 4 the
terminal's size as ``{"Width": W, "Height": H}``, ``[255, 0]`` closes stdin; Kubernetes API reference, "pods/exec",
and KEP-4006). With a terminal on stdin it asks for ``tty=true`` (the container's side gets a pty, its output
comes on channel 1), puts the local terminal in raw mode and sends its size at the start and on each SIGWINCH;
without one, stdin is streamed until its end (then closed) and stdout/stderr stay apart. The exit code is the
command's (``NonZeroExitCode``'s ``ExitCode`` cause), as `ssh` gives the remote one.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import sys
import threading
from typing import Any

PROTOCOLS = ["v5.channel.k8s.io", "v4.channel.k8s.io"]


def exit_code(status: dict[str, Any]) -> int:
    """The command's exit code from the error channel's ``Status``."""
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            with contextlib.suppress(TypeError, ValueError):
                return int(cause.get("message"))
    sys.stderr.write(f"gtrain ssh: {status.get('message') or status.get('reason') or 'exec failed'}\n")
    return 1


def _size() -> bytes:
    cols, rows = os.get_terminal_size(sys.stdin.fileno())
    return b"\x04" + json.dumps({"Width": cols, "Height": rows}).encode()


def connect(context: str, namespace: str, pod: str, command: list[str], tty: bool) -> Any:
    """The exec websocket (a context manager), through lightkube's client and its kubeconfig handling."""
    from lightkube.core.websocket import connect_ws
    from lightkube.resources.core_v1 import Pod

    from gtrain.providers.kubernetes.api import client

    c = client(context or None, namespace)
    generic = c._client  # lightkube's request builder and its httpx client (what Client.exec uses)
    params = {"command": command, "stdin": True, "stdout": True, "stderr": not tty, "tty": tty}
    br = generic.prepare_request("exec", Pod, None, pod, namespace, params=params)
    return connect_ws(br.url, generic._client, subprotocols=PROTOCOLS, params=br.params)


def session(ws: Any, tty: bool, stdin_fd: int, out: Any, err: Any) -> int:
    """Pump stdin to channel 0 and channels 1/2 to ``out``/``err`` until the Status on channel 3."""
    send_lock = threading.Lock()

    def send(data: bytes) -> None:
        with send_lock, contextlib.suppress(Exception):  # the session may have ended meanwhile
            ws.send_bytes(data)

    def pump_stdin() -> None:
        while True:
            try:
                data = os.read(stdin_fd, 65536)
            except OSError:
                data = b""
            if not data:
                if ws.subprotocol == PROTOCOLS[0]:
                    send(b"\xff\x00")  # v5: stdin closed
                return
            send(b"\x00" + data)

    if tty:
        send(_size())
        with contextlib.suppress(ValueError):  # not the main thread (a test): no resize forwarding
            signal.signal(signal.SIGWINCH, lambda *_: send(_size()))
    threading.Thread(target=pump_stdin, daemon=True, name="gtrain-ssh-stdin").start()
    from httpx2.websockets import WebSocketDisconnect

    while True:
        try:
            msg = ws.receive_bytes(timeout=None)
        except queue.Empty:
            continue
        except WebSocketDisconnect:
            return 0 if tty else 1  # closed without a Status: an old server; nothing more to say
        channel, data = msg[0], msg[1:]
        if channel == 1:
            out.write(data)
            out.flush()
        elif channel == 2:
            err.write(data)
            err.flush()
        elif channel == 3:
            try:
                return exit_code(json.loads(data or b"{}"))
            except ValueError:
                return 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    context, namespace, pod, command = args[0], args[1], args[2], args[3:] or ["sh"]
    tty = sys.stdin.isatty()
    from gtrain.errors import GtrainError

    try:
        with connect(context, namespace, pod, command, tty) as ws:
            if not tty:
                return session(ws, False, sys.stdin.fileno(), sys.stdout.buffer, sys.stderr.buffer)
            import termios
            import tty as ttymod

            fd = sys.stdin.fileno()
            saved = termios.tcgetattr(fd)
            try:
                ttymod.setraw(fd, termios.TCSADRAIN)  # not TCSAFLUSH: what was typed ahead still goes
                return session(ws, True, fd, sys.stdout.buffer, sys.stderr.buffer)
            finally:
                termios.tcsetattr(fd, termios.TCSADRAIN, saved)
    except GtrainError as e:
        sys.stderr.write(f"Error: {e.message}\n")
        return 2
    except Exception as e:  # noqa: BLE001  (one line, as the CLI says every failure)
        sys.stderr.write(f"gtrain ssh: pod {pod}: {type(e).__name__}: {e}\n")
        return 255


if __name__ == "__main__":
    sys.exit(main())
