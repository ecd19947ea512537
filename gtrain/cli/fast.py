"""The fast path of ``main()``: ``gtrain``, ``gtrain -h/--help``, ``gtrain --version``,
``gtrain status [CLUSTER] [--json]`` and ``gtrain sync SRC DST [--delete] [--dry-run] [--workers N] [--json]``
answered without importing typer, click or rich (~30-50 ms saved each).

Exactly those invocations; everything else (any other flag, ``-h``, ``--``, a bad ``--workers`` value, a missing or
extra argument, shell completion) goes to Typer, which answers as it always has (usage errors: its message, exit 2).
The help text is laid out as click lays it out (``HelpFormatter``: width ``min(columns, 80) - 2``, at least 50; its
definition lists and wrapping), and a test compares it with Typer's own at every width. ``sync``'s body is
``gtrain/cli/sync_run.py``, the same function the Typer command calls."""

from __future__ import annotations

import os
import sys

from gtrain.cli.commands import COMMANDS, PROG, ROOT_HELP, ROOT_OPTIONS


def _columns() -> int:
    """``shutil.get_terminal_size().columns`` without importing shutil (~5 ms): COLUMNS, the terminal, 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def _width() -> int:
    return max(min(_columns(), 80) - 2, 50)


def _wrap(text: str, width: int, first: str = "", rest: str = "") -> str:
    import textwrap

    return textwrap.TextWrapper(width, initial_indent=first, subsequent_indent=rest,
                                replace_whitespace=False).fill(text.expandtabs())


def _short(help_text: str, limit: int) -> str:
    """click's ``make_default_short_help``: the first sentence, or as many words as fit, then '...'."""
    words = help_text.split("\n\n")[0].split()
    total = 0
    for i, word in enumerate(words):
        total += len(word) + (i > 0)
        if total > limit:
            break
        if word.endswith("."):
            return " ".join(words[: i + 1])
        if total == limit and i != len(words) - 1:
            break
    else:
        return " ".join(words)
    total += 3
    while i > 0:
        total -= len(words[i]) + (i > 0)
        if total <= limit:
            break
        i -= 1
    return " ".join(words[:i]) + "..."


def _dl(rows: list[tuple[str, str]], width: int, indent: int = 2) -> list[str]:
    first_col = min(max(len(a) for a, _ in rows), 30) + 2
    out = []
    for first, second in rows:
        head = " " * indent + first
        if len(first) <= first_col - 2:
            head += " " * (first_col - len(first))
            lines = _wrap(second, max(width - first_col - 2, 10)).splitlines() or [""]
            out.append(head + lines[0])
        else:
            out.append(head)
            lines = _wrap(second, max(width - first_col - 2, 10)).splitlines() or [""]
            out.append(" " * (first_col + indent) + lines[0])
        out += [" " * (first_col + indent) + ln for ln in lines[1:]]
    return out


def root_help() -> str:
    """`gtrain --help`, as Typer (click) prints it."""
    width = _width()
    prefix = f"Usage: {PROG} "
    lines = [_wrap("[OPTIONS] COMMAND [ARGS]...", width, prefix, " " * len(prefix)), ""]
    lines += [_wrap(ROOT_HELP, width, "  ", "  "), "", "Options:"]
    lines += _dl(list(ROOT_OPTIONS), width)
    limit = width - 6 - max(len(name) for name, _, _ in COMMANDS)
    lines += ["", "Commands:"]
    lines += _dl([(name, _short(text, limit)) for name, _, text in COMMANDS], width)
    return "\n".join(lines) + "\n"


def _status_args(args: list[str]) -> tuple[str | None, bool] | None:
    """``status [CLUSTER] [--json]`` (in either order) -> (cluster, json); None for anything else."""
    rest = [a for a in args if a != "--json"]
    if len(args) - len(rest) > 1 or len(rest) > 1 or any(a.startswith("-") for a in rest):
        return None
    return (rest[0] if rest else None), len(rest) != len(args)


#: ``sync``'s flags and their keyword in :func:`gtrain.cli.sync_run.run_sync`
_SYNC_FLAGS = {"--delete": "delete", "--dry-run": "dry_run", "--json": "json_"}
_SYNC_WORKERS = 16  # the --workers option's default (gtrain/cli/data_cmds.py; a test holds them equal)


def _sync_args(args: list[str]) -> dict[str, object] | None:
    """``SRC DST`` with ``--delete``, ``--dry-run``, ``--json``, ``--workers N`` / ``--workers=N`` (N in 1..128,
    plain digits), in any order, each at most once -> run_sync's keywords; None for anything else."""
    kw: dict[str, object] = {"delete": False, "dry_run": False, "json_": False, "workers": _SYNC_WORKERS}
    seen: set[str] = set()
    pos: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if not a.startswith("-"):
            pos.append(a)
            continue
        name, eq, value = a.partition("=")
        if name in seen:
            return None
        seen.add(name)
        if name in _SYNC_FLAGS and not eq:
            kw[_SYNC_FLAGS[name]] = True
            continue
        if name != "--workers":
            return None  # -h, --help, --, -, an unknown option, a value given to a flag
        if not eq:
            if i == len(args):
                return None
            value, i = args[i], i + 1
        if not (value.isascii() and value.isdigit() and 1 <= int(value) <= 128):
            return None
        kw["workers"] = int(value)
    if len(pos) != 2:
        return None
    kw["src"], kw["dst"] = pos
    return kw


def handle(argv: list[str]) -> int | None:
    """Answer ``argv`` (without the program name) if it is one of the fast invocations: the exit code;
    None means "not one of them" and Typer takes over."""
    if any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return None  # shell completion asking: Typer's business
    if argv in ([], ["--help"], ["-h"]):
        sys.stdout.write(root_help())
        sys.stdout.flush()
        return 0 if argv else 2
    if argv == ["--version"]:
        from gtrain import __version__

        sys.stdout.write(f"{PROG} {__version__}\n")
        return 0
    if argv[:1] == ["status"]:
        parsed = _status_args(argv[1:])
        if parsed is not None:
            from gtrain.cli.views import show_status

            show_status(*parsed)
            return 0
    if argv[:1] == ["sync"]:
        kw = _sync_args(argv[1:])
        if kw is not None:
            from gtrain.cli.sync_run import run_sync

            run_sync(**kw)  # type: ignore[arg-type]
            return 0
    return None
