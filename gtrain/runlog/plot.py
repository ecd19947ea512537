"""`gtrain plot`: one metric of one or more jobs as a terminal line chart (plotext, the ``[plot]`` extra or the
base install), against step or time, redrawn with ``--follow`` until the jobs end."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gtrain.errors import ConfigError, install_hint

if TYPE_CHECKING:
    from gtrain.runlog.model import RunData

X_AXES = ("step", "time")


def _plotext() -> Any:
    """plotext, imported without the help pages it builds at import (``plotext.doc``, unused here: about a
    third of its import time, which counts against the first frame); should that ever break, a plain import."""
    import importlib
    import sys
    import types

    if "plotext" in sys.modules:
        return sys.modules["plotext"]
    stub = types.ModuleType("plotext._doc.doc")
    stub.docs = None  # type: ignore[attr-defined]
    sys.modules.setdefault("plotext._doc.doc", stub)
    try:
        return importlib.import_module("plotext")
    except ImportError as e:
        if e.name and e.name.split(".")[0] == "plotext" and "plotext" not in sys.modules:
            raise ConfigError("gtrain plot needs plotext, which is not installed", field="plot",
                              hint=install_hint("plot")) from e
        raise
    except Exception:  # noqa: BLE001 - a plotext that needs its docs: import it whole
        for name in [m for m in sys.modules if m == "plotext" or m.startswith("plotext.")]:
            del sys.modules[name]
        return importlib.import_module("plotext")


def pick_metric(runs: Sequence[RunData], metric: str | None) -> str:
    names = list(dict.fromkeys(m for r in runs for m in r.metrics()))
    if metric:
        if metric not in names:
            have = ", ".join(names) if names else "none yet"
            raise ConfigError(f"--metric {metric}: no such metric in the job(s) (have: {have})", field="--metric",
                              hint="pick one of those, or log it with gtrain.metrics.log(...)")
        return metric
    if not names:
        raise ConfigError("no metrics logged yet: nothing to plot", field="--metric",
                          hint="log them with gtrain.metrics.log(step=..., loss=...), or pass --log-keys loss")
    return "loss" if "loss" in names else names[0]


def frame(runs: Sequence[RunData], metric: str, *, x: str = "step", width: int = 80, height: int = 24,
          color: bool = False) -> str:
    """One chart as text: ``metric`` of each run's lowest rank, downsampled to what the width can show."""
    from gtrain.runlog.model import downsample

    plt = _plotext()
    plt.terminal.limit(False, False)  # the size asked for is the size drawn (piped output has no terminal)
    f = plt.figure
    f.clear()
    f.plot_size(max(20, width), max(8, height))
    drawn = 0
    t0 = min((t for r in runs for s in r.of(metric)[:1] for t in s.t if t is not None), default=0.0)
    for r in runs:
        series = r.of(metric)
        if not series:
            continue
        s = series[0]
        xs = s.x if x == "step" else [((t or t0) - t0) / 60 for t in s.t]
        dx, dy = downsample(xs, s.y, max(40, width * 4))
        if not dx:
            continue
        label = r.job["id"] if len(runs) > 1 else f"rank {s.rank}"
        f.draw(f.signal(dx, dy, marker="braille").lines().label(label))
        drawn += 1
    f.title(f"{metric}  ({', '.join(r.job['id'] for r in runs)})")
    f.label("step" if x == "step" else "minutes")
    if not color:
        f.theme("colorless")
    return str(f.build().string(colorless=not color))


def plot(cluster: str, *, job_ids: Sequence[str] = (), metric: str | None = None, x: str = "step",
         follow: bool = False, log_keys: Sequence[str] = (), size: Callable[[], tuple[int, int]] | None = None,
         write: Callable[[str, bool], None], color: bool = False, interval: float = 2.0,
         report: Any = None) -> str:
    """Draw the chart through ``write(text, first)``; with ``follow``, fetch new points and redraw every
    ``interval`` seconds until every job has ended. Returns the metric drawn."""
    from gtrain.runlog import archive
    from gtrain.runlog.service import _ctx, collect

    if x not in X_AXES:
        raise ConfigError(f"--x {x}: give step or time", field="--x")
    _plotext()  # fail before any work when it is missing
    ctx = _ctx(report)
    get_size = size or terminal_size
    try:
        c = archive.find_cluster(ctx.store, cluster)
        jobs = [archive.find_job(ctx.store, c, j) for j in (job_ids or [None])]  # type: ignore[list-item]
        first = running = True
        while True:
            runs = [collect(ctx, c, j, log_keys=log_keys, costs=False, gpus=False,
                            progress=False) for j in jobs]
            w, h = get_size()
            try:
                name = pick_metric(runs, metric)
                text = frame(runs, name, x=x, width=w, height=h - 2)  # room for the prompt
            except ConfigError:
                if not (follow and running):
                    raise
                name, text = metric or "", f"waiting for {metric or 'metrics'} from {', '.join(j.id for j in jobs)}"
            write(text, first)
            first = False
            if not follow or not running:
                return name
            time.sleep(interval)
            c = archive.find_cluster(ctx.store, cluster)
            running = _any_running(ctx, c, jobs)  # one more frame after the end: its last points
    finally:
        ctx.store.close()


def terminal_size() -> tuple[int, int]:
    """The terminal's size now (asked of stdout's terminal each frame, so --follow follows a resize; an exported
    COLUMNS/LINES can be stale, e.g. from the shell a tmux pane started with); not a terminal: COLUMNS or 80x24."""
    import os
    import shutil
    import sys

    try:
        ts = os.get_terminal_size(sys.stdout.fileno())
        if ts.columns > 0 and ts.lines > 0:
            return ts.columns, ts.lines
    except (OSError, ValueError, AttributeError):
        pass
    ts = shutil.get_terminal_size((80, 24))
    return ts.columns, ts.lines


def _any_running(ctx: Any, cluster: Any, jobs: list[Any]) -> bool:
    from gtrain.errors import GtrainError
    from gtrain.jobs.status import refresh_job
    from gtrain.state import TERMINAL_JOB

    if cluster.status != "up":
        return False
    running = False
    for i, j in enumerate(jobs):
        if j.status in TERMINAL_JOB:
            continue
        try:
            jobs[i] = refresh_job(cluster, j, ctx, act=False)
        except GtrainError:
            return True
        running = running or jobs[i].status not in TERMINAL_JOB
    return running
