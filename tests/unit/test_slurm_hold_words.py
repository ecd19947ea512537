"""slurm.hold: a step's state in Slurm's words from the allocation's row and the login-side wrapper's files,
and the salloc options of the allocation (no batch-only ones)."""

from __future__ import annotations

import pytest

from gtrain.providers.slurm.hold import salloc_options, step_word


@pytest.mark.parametrize(("alloc", "step", "word"), [
    ("RUNNING", {"started": True, "alive": False, "exit": [0, 1.0]}, "COMPLETED"),
    ("RUNNING", {"started": True, "alive": False, "exit": [7, 1.0]}, "FAILED"),
    ("RUNNING", {"started": True, "alive": False, "exit": [137, 1.0], "cancelled": True}, "CANCELLED"),
    ("RUNNING", {"started": True, "alive": False, "cancelled": True}, "CANCELLED"),
    ("RUNNING", {"started": True, "alive": False}, "FAILED"),  # the wrapper is gone without an exit file
    ("RUNNING", {"started": True, "alive": True}, "RUNNING"),
    ("RUNNING", {}, "PENDING"),  # started detached, not yet running
    ("TIMEOUT", {"started": True, "alive": True}, "TIMEOUT"),  # the held allocation's own end decides
    ("CANCELLED", {"started": True, "alive": True}, "CANCELLED"),
    (None, {"started": True, "alive": True}, None),
])
def test_step_word(alloc: str | None, step: dict[str, object], word: str | None) -> None:
    assert step_word(alloc, "", step)[0] == word


def test_salloc_options_drop_the_batch_only_ones() -> None:
    lines = ["--job-name=gtrain-hold-x", "--nodes=2", "--output=/x/batch.log", "--open-mode=append", "--requeue",
             "--signal=B:USR1@120", "--exclusive", "--mem 0"]
    assert salloc_options(lines) == ["--job-name=gtrain-hold-x", "--nodes=2", "--exclusive", "--mem", "0"]


def test_plan_says_up_holds_an_allocation(tmp_path: object) -> None:
    from gtrain.providers.slurm.provider import SlurmProvider
    from gtrain.spec import parse_spec
    from gtrain.state import StateStore

    spec = parse_spec({"name": "s", "provider": "slurm", "num_nodes": 2, "slurm": {"hold": True},
                       "job": {"run": "train.py"}})
    notes = SlurmProvider(StateStore(tmp_path)).plan(spec).notes  # type: ignore[arg-type]
    assert any("holds an allocation of 2 node(s) (salloc --no-shell)" in n for n in notes), notes
