"""What of a job's lines reaches the screen (the log keeps every byte): a carriage-return progress bar (tqdm) as
its latest state, torchrun's ``ChildFailedError`` report as one line, a launcher's ``--- Logging error ---``
block (its output closed under it as gtrain stopped it) as one line, and each rank's last lines kept for the
summary that ends a failed run."""

from __future__ import annotations

import re
from collections import deque

#: lines of each rank kept for the end of a failed run
LAST_LINES = 12
_DUMP_START = re.compile(r"^Traceback \(most recent call last\):\s*$")
_DUMP_ERROR = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
_AGENT = "torch.distributed.elastic."
_AGENT_FRAME = "/torch/distributed/"  # a traceback through torchrun's own code (its agent, its store)
_CHAIN = ("The above exception was the direct cause", "During handling of the above exception")
_HELD_MAX = 400  # a traceback longer than this is shown as it is
#: ``logging.Handler.handleError``'s block: this line, the traceback, ``Call stack:``, then ``Message: %r`` and
#: ``Arguments: %s`` (or its two lines on a formatting error)
_LOG_ERROR = "--- Logging error ---"
_LOG_ERROR_END = ("Arguments: ", "Use the traceback above to help find the error.")


def latest(text: str) -> str:
    """A line a progress bar redrew with ``\\r``: what the terminal would show last."""
    if "\r" not in text:
        return text
    parts = [p for p in text.split("\r") if p.strip()]
    return parts[-1] if parts else ""


def _short(text: str) -> str:
    """``torch.distributed.elastic.x.y.SignalException: msg`` -> ``SignalException: msg``."""
    head, _, msg = text.partition(":")
    return f"{head.rsplit('.', 1)[-1]}:{msg}"


class Screen:
    """Per node: hold an agent-level traceback until it is known to be torchrun's ChildFailedError report
    (then drop it for one line) or something else (then show it); per rank: the last lines."""

    def __init__(self, collapse: bool = True) -> None:
        self.collapse = collapse  # False (`logs` without -f): every line of the report, as the log has it
        self.held: dict[int, list[str]] = {}
        self.in_dump: dict[int, int] = {}  # node -> '=====' rules seen inside the report
        self.last: dict[tuple[int, int | None], deque[str]] = {}
        self.chained: set[int] = set()  # nodes just past a collapsed torchrun traceback (its chain follows)
        self.log_error: dict[int, list[str]] = {}  # node -> the logging-error block so far

    def feed(self, node: int, rank: int | None, text: str) -> list[str]:
        """The texts to show for one line of node ``node`` (``rank`` None: the node's own launcher)."""
        text = latest(text)
        if rank is None and self.collapse:
            shown = self._agent(node, text)
        else:
            shown = [text]
        keep = self.last.setdefault((node, rank), deque(maxlen=LAST_LINES))
        keep.extend(shown)
        return shown

    def _agent(self, node: int, text: str) -> list[str]:
        if text == _LOG_ERROR and node not in self.log_error and node not in self.held:
            self.log_error[node] = []
            return []
        if node in self.log_error:
            return self._logging_error(node, text)
        if node in self.in_dump:  # inside the report: its rules frame the header and the end
            if text.startswith("====="):
                self.in_dump[node] += 1
                if self.in_dump[node] >= 2:
                    del self.in_dump[node]
            return []
        held = self.held.get(node)
        if held is None and node in self.chained:
            if text == "" or text.startswith(_CHAIN):
                return []
            if not _DUMP_START.match(text):
                self.chained.discard(node)
        if held is None:
            if _DUMP_START.match(text):
                self.held[node] = [text]
                return []
            return [text]
        if _DUMP_ERROR in text:
            del self.held[node]
            self.in_dump[node] = 0
            return ["torchrun: a rank failed (ChildFailedError); its full report is in the log "
                    f"(`gtrain logs CLUSTER --node {node}`)"]
        held.append(text)
        ended = not (text.startswith((" ", "\t")) or text == "")
        if ended and (text.startswith(_AGENT) or any(_AGENT_FRAME in h for h in held)):
            # torchrun's own (stopped by a signal, or its store gone with the node that held it): one line
            del self.held[node]
            self.chained.add(node)
            return [f"torchrun: {text.rsplit('.', 1)[-1] if ':' not in text else _short(text)} "
                    "(its traceback is in the log)"]
        if len(held) > _HELD_MAX or ended:
            return self.flush(node)  # a traceback of something else: its last line ends it
        return []

    def _logging_error(self, node: int, text: str) -> list[str]:
        block = self.log_error[node]
        block.append(text)
        if not text.startswith(_LOG_ERROR_END) and len(block) <= _HELD_MAX:
            return []
        del self.log_error[node]
        if len(block) > _HELD_MAX:  # not the block it looked like: shown as it is
            return [_LOG_ERROR, *block]
        exc = next((b for b in block if b and not b.startswith((" ", "\t", "Traceback", "Call stack:"))
                    and ":" in b), "")
        msg = next((b[len("Message: "):] for b in block if b.startswith("Message: ")), "")
        what = f"could not log {msg}" if msg else "a logging error"
        return [f"launcher: {what} ({exc.split(':', 1)[0] or 'error'}: its output was closed under it); "
                "the traceback is in the log"]

    def flush(self, node: int | None = None) -> list[str]:
        """What is held (a traceback not yet ended), for ``node`` or every node."""
        nodes = [node] if node is not None else sorted({*self.held, *self.log_error})
        out: list[str] = []
        for n in nodes:
            out.extend(self.held.pop(n, []))
            if n in self.log_error:
                out.extend([_LOG_ERROR, *self.log_error.pop(n)])
        return out

    def last_lines(self, node: int, rank: int | None) -> list[str]:
        return list(self.last.get((node, rank), ()))
