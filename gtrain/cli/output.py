"""Rendering for the CLI: stdout carries results (or one JSON document with --json); progress, warnings
and errors go to stderr. Colour only on a TTY (and never with NO_COLOR)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from gtrain.events import Reporter

_json_mode = False


def set_json(flag: bool) -> None:
    global _json_mode
    _json_mode = flag


def json_mode() -> bool:
    return _json_mode


def _color(stream: Any) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    tty = _color(stream)
    # Not a terminal (CI, a pipe): don't wrap tables at 80 columns.
    return Console(file=stream, no_color=not tty, highlight=False, soft_wrap=True,
                   force_terminal=None if tty else False, width=None if stream.isatty() else 240)


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def err(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


class CLIReporter(Reporter):
    """Progress on stderr, one line each. Job lines (setup output) go there too."""

    def __init__(self) -> None:
        self.color = _color(sys.stderr)

    def _w(self, prefix: str, msg: str, style: str = "") -> None:
        if self.color and style:
            sys.stderr.write(f"\x1b[{style}m{prefix}\x1b[0m{msg}\n")
        else:
            sys.stderr.write(f"{prefix}{msg}\n")
        sys.stderr.flush()

    def info(self, msg: str) -> None:
        self._w("• ", msg, "36")

    def warn(self, msg: str) -> None:
        self._w("warning: ", msg, "33")

    def node(self, rank: int, msg: str) -> None:
        self._w(f"  node {rank}: ", msg, "2")

    def line(self, node: int, rank: int | None, text: str) -> None:
        self._w(f"[node {node}{'' if rank is None else f' rank {rank}'}] ", text, "2")


_PALETTE = ("36", "35", "32", "33", "34", "31", "96", "95")


class LinePrinter:
    """``[node K rank R] text`` on stdout, coloured per rank on a TTY only."""

    def __init__(self) -> None:
        self.color = _color(sys.stdout)

    def __call__(self, line: Any) -> None:
        prefix = f"[node {line.node}{'' if line.rank is None else f' rank {line.rank}'}]"
        if self.color:
            c = _PALETTE[(line.rank if line.rank is not None else line.node) % len(_PALETTE)]
            sys.stdout.write(f"\x1b[{c}m{prefix}\x1b[0m {line.text}\n")
        else:
            sys.stdout.write(f"{prefix} {line.text}\n")
        sys.stdout.flush()


def fmt_time(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%m-%d %H:%M:%S", time.localtime(ts))


def fmt_usd(v: float | None) -> str:
    if v is None:
        return "-"
    return f"${v:,.4f}" if v < 1 else f"${v:,.2f}"


def table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.table import Table

    t = Table(title=title, box=None, header_style="bold", pad_edge=False, title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    console().print(t)


def cost_table(report: Any) -> None:
    rows = [[ln.node_rank, ln.instance_type or "-", ln.market or "-", fmt_time(ln.started_at),
             fmt_time(ln.stopped_at), f"{ln.hours:.4f}", fmt_usd(ln.price_per_hour),
             fmt_usd(ln.cost_usd) + ("*" if ln.estimate else "")] for ln in report.lines]
    table(f"cost of {report.cluster} ({report.provider})",
          ["node", "instance type", "market", "start", "stop", "hours", "$/h", "$"], rows)
    note = "  (* estimate)" if report.estimate else ""
    console().print(f"total: {fmt_usd(report.total_usd)} for {report.node_hours:.4f} node-hours{note}")
