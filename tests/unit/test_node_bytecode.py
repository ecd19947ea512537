"""gtrain's node-side programs run from bytecode the node keeps (gtrain.remote.base.boot): compiled once per
source and interpreter under ROOT/.gtrain-node/py, loaded after that; a cache that cannot be read is passed by.
Run through a real runner (the local one: ``bash -c 'python -c BOOT ARGS'`` with the program on stdin)."""

from __future__ import annotations

import marshal
import sys
from pathlib import Path

from gtrain.remote.base import PY_CACHE, boot
from gtrain.remote.local import LocalRunner

PROGRAM = """from __future__ import annotations
import sys
from dataclasses import dataclass

@dataclass
class Said:
    args: list[str]

print(Said(sys.argv[1:]), sys.argv[0], __name__)
"""


def test_a_node_program_runs_as_python_dash_would_and_is_compiled_once(tmp_path: Path) -> None:
    r = LocalRunner(tmp_path)
    first = r.run_python(PROGRAM, ["a", "b c"]).stdout.strip()
    assert first == "Said(args=['a', 'b c']) - __main__"
    kept = list((tmp_path / PY_CACHE).iterdir())
    assert len(kept) == 1 and kept[0].name.startswith(sys.implementation.cache_tag)
    # what runs the second time is what the cache holds, not a fresh compile of the source sent
    kept[0].write_bytes(marshal.dumps(compile("print('from the cache')", "<t>", "exec")))
    assert r.run_python(PROGRAM, ["a"]).stdout.strip() == "from the cache"
    kept[0].write_bytes(b"\x00 not bytecode")  # unreadable: compiled again, and kept again
    assert r.run_python(PROGRAM, ["x"]).stdout.strip() == "Said(args=['x']) - __main__"
    assert marshal.loads(kept[0].read_bytes()) is not None
    r.run_python(PROGRAM.replace("print(", "print('v2', "), [])  # another source: its own entry
    assert len(list((tmp_path / PY_CACHE).iterdir())) == 2


def test_without_a_root_nothing_is_kept_and_the_node_functions_still_answer(tmp_path: Path) -> None:
    assert "_d = ''" in boot("/")
    r = LocalRunner(tmp_path)
    (tmp_path / "jobs" / "j1").mkdir(parents=True)
    (tmp_path / "jobs" / "j1" / "state.json").write_text('{"state": "succeeded", "exit_code": 0}')
    assert r.run_python(r"print('ok')", []).stdout.strip() == "ok"
    doc = r.call("job_state", str(tmp_path / "jobs" / "j1"))
    assert doc["state"] == "succeeded"
