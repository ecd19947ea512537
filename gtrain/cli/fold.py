"""Identical lines from many ranks as one line on the screen, the ranks named: ``[ranks 0-63] loss 2.31``.

ClusterShell's ``clush -b`` / ``clubak -b`` (and dshbak before it) gather a command's output and print each
distinct output once under the folded set of nodes that gave it; they wait for the command to end. A job's
log has no end to wait for, so :class:`Folder` gathers over a short window instead: a line opens a group
keyed by its text; the same text from other ranks joins the group while it is open (until ``window_s``
passes with no rank joining, ``hold_s`` at most; longer in the first seconds, while the nodes' streams
connect); then the group is one line, under its ranks. Groups leave
in the order they opened, so each rank's lines keep their order. Nothing is dropped: every distinct text is
shown, with the ranks that printed it. As with clush, only identical texts fold: a line that names its rank
(``rank 3 ready``) stays its rank's own (a folded ``rank *`` would hide the one thing that differs, and
scripts read each rank's line).

Never folded, shown as the rank printed them (once the groups opened before them are shown, so each rank's
lines keep their order: within ``hold_s``): lines that look like an error (:data:`ERROR`: an
exception's name, ``Traceback``, ``ERROR``/``FATAL``, ``error:``, a non-zero exit, a signal, out of memory)
and every line of a Python traceback, per rank. A folded group that most but not all ranks printed names the
ranks it lacks (``missing: rank 17``): the rank that stalls, or printed something else.

Pure: the caller gives the clock (``now``) and prints what comes back. Only the screen folds: ``--json``,
``--rank``/``--node`` and the logs kept on the nodes and in the run archive have every line."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

#: a group closes this long after the last rank joined it ...
WINDOW_S = 0.5
#: ... and this long after it opened, at the latest
HOLD_S = 2.0
#: for this long after the first line, a group waits longer (``START_WINDOW_S``, ``START_HOLD_S``): the nodes'
#: streams connect seconds apart (one SSH session each) and each begins with the lines it holds already
START_S = 5.0
START_WINDOW_S = 2.0
START_HOLD_S = 6.0
#: a folded group names the ranks it lacks when it has at least this share of the ranks seen so far ...
MISSING_SHARE = 0.5
#: ... and lacks at most this many
MISSING_MAX = 8
#: runs of consecutive ranks shown in a label before the rest is counted
MAX_RUNS = 8

ERROR = re.compile(
    r"Traceback \(most recent call last\)|(Error|Exception)\b|\b(ERROR|FATAL|CRITICAL|FAILED|Killed)\b"
    r"|(?i:\berror\s*:|segmentation fault|core dumped|out of memory|\bexited( with)?( exit)?( code| status)?"
    r"[\s:=]+-?[1-9]|\bexit (code|status)[\s:=]*-?[1-9]|^E\d{4} |NCCL WARN|The above exception"
    r"|During handling of the above)")
_CHAIN = ("The above exception", "During handling of the above")


@lru_cache(maxsize=4096)  # the same text from many ranks: read once
def is_error(text: str) -> bool:
    return ERROR.search(text) is not None


def ranges(nums: Iterable[int], max_runs: int = MAX_RUNS) -> str:
    """``[0, 1, 2, 3, 7, 9, 10]`` -> ``0-3,7,9-10`` (ClusterShell's folded nodeset notation); past ``max_runs``
    runs, ``...`` and how many there are in all."""
    ordered = sorted(set(nums))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    if len(runs) > max_runs:
        return ",".join(runs[:max_runs]) + f",... ({len(ordered)} in all)"
    return ",".join(runs)


@dataclass
class Out:
    """One line for the screen: a rank's own (``members`` None: ``[node K rank R] text``) or a folded group
    (``[ranks 0-63] text``; ``kind`` "nodes" for the nodes' own lines, rank None)."""

    node: int
    rank: int | None
    text: str
    members: tuple[int, ...] | None = None
    kind: str = "ranks"
    missing: tuple[int, ...] = ()

    def label(self) -> str:
        if self.members is None:
            return f"[node {self.node}{'' if self.rank is None else f' rank {self.rank}'}]"
        return f"[{self.kind} {ranges(self.members)}]"

    def suffix(self) -> str:
        """``  (missing: rank 17)`` when a folded group lacks a few of the ranks seen so far."""
        if not self.missing:
            return ""
        return f"  (missing: {self.kind[:-1] if len(self.missing) == 1 else self.kind} {ranges(self.missing)})"

    def line(self) -> str:
        return f"{self.label()} {self.text}{self.suffix()}"


@dataclass
class _Group:
    key: tuple[bool, str]
    first: Out  # the line that opened it
    opened: float
    last: float
    members: dict[int, int | None] = field(default_factory=dict)  # rank (or node) -> node
    closed: bool = False


class Folder:
    """Feed it every line (after :class:`gtrain.cli.screen.Screen`) with the time; print what it returns,
    and what :meth:`tick` returns every ~0.1 s; :meth:`flush` at the end."""

    def __init__(self, window_s: float = WINDOW_S, hold_s: float = HOLD_S, start_s: float = START_S) -> None:
        self.window_s = window_s
        self.hold_s = hold_s
        self.start_s = start_s
        self.first: float | None = None  # when the first line came
        self.pending: deque[_Group] = deque()  # in the order they opened
        self.open: dict[tuple[bool, str], _Group] = {}
        self.seen: dict[bool, set[int]] = {True: set(), False: set()}  # ranks (True) / nodes (False) seen
        self.traceback: set[tuple[int, int | None]] = set()  # sources inside a Python traceback

    def feed(self, node: int, rank: int | None, text: str, now: float) -> list[Out]:
        by_rank = rank is not None
        member = rank if rank is not None else node
        if self.first is None:
            self.first = now
        shown = self.tick(now)  # what closed before this line came (it is not missing from those)
        self.seen[by_rank].add(member)
        if self._unfolded(node, rank, text):  # in line behind the groups opened before it, shown as it is
            self.pending.append(_Group((by_rank, text), Out(node, rank, text), now, now, {member: node}, True))
            return shown + self.tick(now)
        key = (by_rank, text)
        group = self.open.get(key)
        if group is not None and self._over(group, now):  # its time is up (it leaves when those before it do)
            self._close(group)
            group = None
        if group is not None and member in group.members:  # the same rank again: the group is over
            shown += self._until(group)
            group = None
        if group is None:
            group = _Group(key, Out(node, rank, text), now, now)
            self.open[key] = group
            self.pending.append(group)
        group.members[member] = node
        group.last = now
        return shown

    def tick(self, now: float) -> list[Out]:
        """The groups whose time is up, in the order they opened (a later one waits for an earlier one)."""
        shown: list[Out] = []
        while self.pending and (self.pending[0].closed or self._over(self.pending[0], now)):
            g = self.pending.popleft()
            self._close(g)
            shown.append(self._out(g))
        return shown

    def _over(self, g: _Group, now: float) -> bool:
        if g.closed:
            return True
        early = self.first is not None and g.opened - self.first < self.start_s
        window, hold = (START_WINDOW_S, START_HOLD_S) if early else (self.window_s, self.hold_s)
        return now - g.last >= window or now - g.opened >= hold

    def flush(self) -> list[Out]:
        """Every group still held, in order."""
        return self._until(self.pending[-1]) if self.pending else []

    def _until(self, group: _Group) -> list[Out]:
        shown: list[Out] = []
        while self.pending:
            g = self.pending.popleft()
            self._close(g)
            shown.append(self._out(g))
            if g is group:
                break
        return shown

    def _close(self, g: _Group) -> None:
        g.closed = True
        if self.open.get(g.key) is g:
            del self.open[g.key]

    def _unfolded(self, node: int, rank: int | None, text: str) -> bool:
        """A line shown as it is, at once: an error's, or inside a traceback of this source."""
        src = (node, rank)
        if src in self.traceback:
            if not (text == "" or text.startswith((" ", "\t", "Traceback", *_CHAIN))):
                self.traceback.discard(src)  # the exception's own line ends it
            return True
        if text.startswith("Traceback (most recent call last)"):
            self.traceback.add(src)
            return True
        return is_error(text)

    def _out(self, g: _Group) -> Out:
        if len(g.members) == 1:
            return g.first
        by_rank = g.key[0]
        members = tuple(sorted(g.members))
        seen = self.seen[by_rank]
        missing: tuple[int, ...] = ()
        lacking = seen.difference(g.members)
        if lacking and len(g.members) >= MISSING_SHARE * len(seen) and len(lacking) <= MISSING_MAX:
            missing = tuple(sorted(lacking))
        return Out(g.first.node, g.first.rank, g.key[1], members, "ranks" if by_rank else "nodes", missing)
