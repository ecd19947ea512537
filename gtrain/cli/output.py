"""Rendering for the CLI: stdout carries results (or one JSON document with --json); progress, warnings
and errors go to stderr. Colour only on a TTY (and never with NO_COLOR)."""

from __future__ import annotations

import os
import sys
import time

from gtrain.events import Reporter

TYPE_CHECKING = False  # typing itself costs ~5 ms of start-up

if TYPE_CHECKING:
    from typing import Any

_json_mode = False


def set_json(flag: bool) -> None:
    global _json_mode
    _json_mode = flag


def json_mode() -> bool:
    return _json_mode


def clean(text: str, *, keep_sgr: bool = False) -> str:
    """What may reach the user's terminal or a result: every registered secret (and its encoded forms)
    masked, and every terminal control sequence removed (:mod:`gtrain.termsafe`; plain colours kept with
    ``keep_sgr``)."""
    from gtrain.redact import scrub
    from gtrain.termsafe import safe

    return safe(scrub(text), keep_sgr=keep_sgr)


def _color(stream: Any) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


class Plain:
    """What the commands print results with: plain text on stdout (or stderr), no markup, no rich."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def print(self, *objs: Any, markup: bool = False, end: str = "\n") -> None:
        self.stream.write(" ".join(str(o) for o in objs) + end)
        self.stream.flush()


def console(stderr: bool = False) -> Plain:
    return Plain(sys.stderr if stderr else sys.stdout)


def rich_console(stderr: bool = False) -> Any:
    """A rich Console, for what needs rich itself (the sync progress bar); imports rich."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    tty = _color(stream)
    return Console(file=stream, no_color=not tty, highlight=False, soft_wrap=True,
                   force_terminal=None if tty else False)


def say(msg: str) -> None:
    """One result line on stdout."""
    sys.stdout.write(clean(msg) + "\n")
    sys.stdout.flush()


def emit_json(doc: Any) -> None:
    import json

    from gtrain.redact import scrub_obj

    sys.stdout.write(clean(json.dumps(scrub_obj(doc), indent=2, sort_keys=True, default=str)) + "\n")
    sys.stdout.flush()


def err(msg: str) -> None:
    sys.stderr.write(clean(msg) + "\n")
    sys.stderr.flush()


class CLIReporter(Reporter):
    """Progress on stderr, one line each. Job lines (setup output) go there too."""

    def __init__(self) -> None:
        self.color = _color(sys.stderr)

    def _w(self, prefix: str, msg: str, style: str = "") -> None:
        msg = clean(msg)
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
    """``[node K rank R] text`` on stdout, coloured per rank on a TTY only. With ``fold``, identical lines of
    many ranks as one, the ranks named (gtrain.cli.fold: a short window; a ticker thread shows a group once
    its window is over), errors and tracebacks never folded."""

    TICK_S = 0.1

    def __init__(self, follow: bool = True, fold: bool = False) -> None:
        import threading

        from gtrain.cli.screen import Screen

        self.color = _color(sys.stdout)
        # progress bars as their latest state; while following, torchrun's failure report as one line
        self.screen = Screen(collapse=follow)
        self.folder = None
        if fold:
            from gtrain.cli.fold import Folder

            self.folder = Folder()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __call__(self, line: Any) -> None:
        with self._lock:
            for text in self.screen.feed(line.node, line.rank, line.text):
                if self.folder is None:
                    self._write(line.node, line.rank, text)
                else:
                    self._show(self.folder.feed(line.node, line.rank, text, time.monotonic()))
        if self.folder is not None and self._ticker is None:
            import threading

            self._ticker = threading.Thread(target=self._tick, daemon=True, name="gtrain-fold")
            self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.TICK_S):
            with self._lock:
                if self.folder is not None:
                    self._show(self.folder.tick(time.monotonic()))

    def close(self) -> None:
        """Show what is still held (folded groups not yet shown, a launcher's traceback the job ended in)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=1)
        with self._lock:
            if self.folder is not None:
                self._show(self.folder.flush())
            for node in sorted(self.screen.held):
                for text in self.screen.flush(node):
                    self._write(node, None, text)

    def _show(self, outs: Any) -> None:
        for o in outs:
            if o.members is None:
                self._write(o.node, o.rank, o.text)
            else:
                self._write(o.node, o.rank, o.text, label=o.label(), more=o.suffix())

    def _write(self, node: int, rank: int | None, text: str, label: str | None = None, more: str = "") -> None:
        prefix = label or f"[node {node}{'' if rank is None else f' rank {rank}'}]"
        text = clean(text, keep_sgr=True) + more
        if self.color:
            c = _PALETTE[(rank if rank is not None else node) % len(_PALETTE)]
            sys.stdout.write(f"\x1b[{'1;' if label else ''}{c}m{prefix}\x1b[0m {text}\n")
        else:
            sys.stdout.write(f"{prefix} {text}\n")
        sys.stdout.flush()


def fmt_time(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%m-%d %H:%M:%S", time.localtime(ts))


def fmt_usd(v: float | None) -> str:
    if v is None:
        return "-"
    return f"${v:,.4f}" if v < 1 else f"${v:,.2f}"


def width_limit(stream: Any = None) -> int | None:
    """How wide a table may be: ``COLUMNS`` when set, the terminal's width on a terminal, else no limit
    (a pipe or a file gets whole lines)."""
    stream = stream or sys.stdout
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    if stream.isatty():
        import shutil

        return shutil.get_terminal_size().columns
    return None


def _fit(natural: list[int], floor: list[int], limit: int | None) -> list[int]:
    """Column widths: the natural ones, narrowed (widest first, never below a column's longest word) until
    the row fits ``limit``; a row that cannot fit stays wider rather than break a word."""
    widths = list(natural)
    if limit is None:
        return widths
    while sum(widths) + 2 * (len(widths) - 1) > limit:
        shrinkable = [i for i, w in enumerate(widths) if w > floor[i]]
        if not shrinkable:
            break
        i = max(shrinkable, key=lambda k: widths[k])
        widths[i] -= 1
    return widths


def render_table(columns: list[str], rows: list[list[Any]], limit: int | None, bold: bool = False) -> list[str]:
    """The lines of a table: columns two spaces apart, a cell wrapped inside its column at spaces only."""
    import textwrap

    cells = [[str(c) for c in columns]] + [[str(x) for x in r] for r in rows]
    n = len(columns)
    natural = [max(len(r[i]) for r in cells) for i in range(n)]
    floor = [max((len(w) for r in cells for w in r[i].split()), default=0) for i in range(n)]
    widths = _fit(natural, floor, limit)
    lines = []
    for k, r in enumerate(cells):
        wrapped = [textwrap.wrap(c, w, break_long_words=False, break_on_hyphens=False) or [""]
                   for c, w in zip(r, widths, strict=True)]
        for j in range(max(len(x) for x in wrapped)):
            parts = [(x[j] if j < len(x) else "").ljust(w) for x, w in zip(wrapped, widths, strict=True)]
            line = "  ".join(parts).rstrip()
            lines.append(f"\x1b[1m{line}\x1b[0m" if bold and k == 0 else line)
    return lines


def table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    lines = render_table(columns, rows, width_limit(), bold=_color(sys.stdout))
    if title:
        lines.insert(0, title)
    sys.stdout.write("".join(clean(ln, keep_sgr=True) + "\n" for ln in lines))
    sys.stdout.flush()


def placement_table(placement: dict[str, Any] | None) -> None:
    """``resources.any_of``: every candidate priced side by side and what became of it (up, status, cost)."""
    if not placement:
        return
    rows = [[c["candidate"], c["label"], c["instance_type"] or "-", c["market"] or "-", c["region"] or "-",
             "-" if c["cluster_price_per_hour"] is None else fmt_usd(c["cluster_price_per_hour"]), c["outcome"],
             c["why"] or ""] for c in placement.get("candidates") or []]
    table(f"candidates (resources.any_of, order: {placement.get('order')})",
          ["#", "candidate", "instance type", "market", "region", "$/h (cluster)", "outcome", "why"], rows)
    moves = placement.get("moves") or []
    if moves:
        table("moves (each cloud's part of the cost)", ["at", "from", "to", "why", "cost there"],
              [[fmt_time(m["at"]), m["from"], m["to"], m["why"], fmt_usd(m["cost_usd"])] for m in moves])


def cost_table(report: Any) -> None:
    rows = [[ln.node_rank, ln.instance_type or "-", ln.market or "-", fmt_time(ln.started_at),
             fmt_time(ln.stopped_at), f"{ln.hours:.4f}", fmt_usd(ln.price_per_hour),
             fmt_usd(ln.cost_usd) + ("*" if ln.estimate else "")] for ln in report.lines]
    table(f"cost of {report.cluster} ({report.provider})",
          ["node", "instance type", "market", "start", "stop", "hours", "$/h", "$"], rows)
    placement_table(getattr(report, "placement", None))
    by = getattr(report, "by", None)
    if by:
        others = getattr(report, "launched_by", None) or []
        say(f"started by {by}" + (f"; jobs launched by {', '.join(others)}" if others else ""))
    rebuilt = [ln.node_rank for ln in report.lines if (ln.note or "").startswith("reconstructed by gtrain attach")]
    if rebuilt:
        say(f"node(s) {rebuilt}: intervals reconstructed by `gtrain attach` from the nodes' launch times")
    note = "  (* estimate)" if report.estimate else ""
    say(f"total: {fmt_usd(report.total_usd)} for {report.node_hours:.4f} node-hours{note}")
    if getattr(report, "price_source", None):
        say(f"$/h frozen at up: {report.price_source}")
    for v in getattr(report, "volumes", None) or []:  # kept by down: billed until `gtrain volume delete`
        say(f"volume {v['name']}: {v['size_gb']} GB at ${v['usd_per_gb_month']:g}/GB-month = "
            f"{fmt_usd(v['usd_per_month'])}/month standing charge, until `gtrain volume delete {v['name']}`")
    if getattr(report, "energy", None) is not None:
        say(energy_line(report.energy))


def energy_line(doc: dict) -> str:  # type: ignore[type-arg]
    """``energy: 3.2 kWh (GPU power only ...); ~1.03 kg CO2e (estimate: ...)`` or ``energy: no energy data``."""
    if doc.get("kwh") is None:
        return f"energy: {doc.get('note') or 'no energy data'}"
    text = f"energy: {doc['kwh']:.4g} kWh ({doc.get('note')})"
    c = doc.get("carbon")
    if c:
        text += (f"; ~{c['kg_co2e']:.3g} kg CO2e (estimate: {c['gco2_per_kwh']:g} gCO2e/kWh, {c['source']}"
                 + (f", {c['date']}" if c.get("date") else "") + ")")
    return text
