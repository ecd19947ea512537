"""Step folders written by several nodes, and pointer files beside them, against moto's S3 (issue 27): a step
folder is complete only once every node that wrote the previous one wrote its part; restore picks the newest
complete step, never a partial one, sets a partial newer one of the node aside, and leaves DeepSpeed's
``latest`` naming the step restored."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gtrain.checkpoints.node import PARTIAL, Uploader, cmd_restore
from gtrain.checkpoints.pull import pull_from_store
from gtrain.checkpoints.store import Store
from tests.integration.test_durable_local import bucket


def _write(root: Path, rel: str, text: str, t: float) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    os.utime(p, (t, t))


def _step(root: Path, node: int, step: int, t: float) -> None:
    """Node ``node``'s part of ZeRO step ``step``: its rank's shard (rank 0 also the model states)."""
    _write(root, f"global_step{step}/zero_pp_rank_{node}_optim_states.pt", f"shard {node} at {step}", t)
    if node == 0:
        _write(root, f"global_step{step}/mp_rank_00_model_states.pt", f"model at {step}", t)


def test_a_step_folder_is_complete_once_every_node_that_wrote_the_previous_one_wrote_it(
        moto_server: str, tmp_path: Path) -> None:
    store = Store(bucket(moto_server, "steps-complete"), "c/run-1")
    n0, n1 = tmp_path / "n0", tmp_path / "n1"
    t = time.time() - 100
    for step in (2, 4):
        _step(n0, 0, step, t + step)
        store.upload(0, n0, f"global_step{step}", sorted(
            str(f.relative_to(n0)) for f in (n0 / f"global_step{step}").iterdir()))
    # the first step folder of the run has no previous one to go by: node 0's part makes it complete
    assert [(c.name, c.complete) for c in store.checkpoints()] == [("global_step2", True), ("global_step4", True)]
    _step(n1, 1, 2, t + 2.5)
    store.upload(1, n1, "global_step2", ["global_step2/zero_pp_rank_1_optim_states.pt"])
    # node 1 wrote step 2: step 4, with node 0's part only, is partial now (node 1 is slower to write it)
    got = {c.name: (c.complete, sorted(c.manifests), sorted(c.expected)) for c in store.checkpoints()}
    assert got == {"global_step2": (True, [0, 1], []), "global_step4": (False, [0], [0, 1])}
    fresh = tmp_path / "fresh"
    ckpt, _got, _kept, _n = store.restore_newest(fresh)
    assert ckpt is not None and ckpt.name == "global_step2"
    assert sorted(p.name for p in (fresh / "global_step2").iterdir()) == [
        "mp_rank_00_model_states.pt", "zero_pp_rank_0_optim_states.pt", "zero_pp_rank_1_optim_states.pt"]
    assert not (fresh / "global_step4").exists()
    _step(n1, 1, 4, t + 4.5)
    store.upload(1, n1, "global_step4", ["global_step4/zero_pp_rank_1_optim_states.pt"])
    assert store.newest_complete() is not None and store.newest_complete().name == "global_step4"  # type: ignore[union-attr]
    # the run goes on with node 0 alone (resized): the first step it writes so is partial, the next whole
    for step in (6, 8):
        _step(n0, 0, step, t + step)
        store.upload(0, n0, f"global_step{step}", sorted(
            str(f.relative_to(n0)) for f in (n0 / f"global_step{step}").iterdir()))
    assert [(c.name, c.complete) for c in store.checkpoints()][2:] == [("global_step6", False), ("global_step8", True)]
    store.close()


def test_restore_takes_the_newest_whole_step_and_the_pointer_names_it(moto_server: str, tmp_path: Path) -> None:
    """DeepSpeed's layout: ``global_stepN/`` shards, ``latest`` (the tag) and ``zero_to_fp32.py`` beside them,
    both rewritten at every save. Node 1 is slower: step 4 has node 0's part only. Every node restores step 2,
    ``latest`` names it, and node 0's own partial step 4 is set aside (not deleted)."""
    store = Store(bucket(moto_server, "steps-pointer"), "c/run-2")
    n0, n1, jobs = tmp_path / "n0", tmp_path / "n1", tmp_path / "jobs"
    for d in (n0, n1, jobs / "0", jobs / "1"):
        d.mkdir(parents=True)
    ups = [Uploader(store, 0, n0, jobs / "0", 1), Uploader(store, 1, n1, jobs / "1", 1)]
    t = time.time() - 100
    for step in (2, 4):
        _step(n0, 0, step, t + step)
        (n0 / f"global_step{step}.done").write_text("")  # marked: no settle time to wait out
        _write(n0, "latest", f"global_step{step}", t + step + 0.1)
        _write(n0, "zero_to_fp32.py", "# DeepSpeed's recovery script\n" * 20, t + step + 0.2)
        assert ups[0].one_pass() == (3 if step == 2 else 3)
        if step == 2:
            _step(n1, 1, step, t + step + 0.3)
            (n1 / f"global_step{step}.done").write_text("")
            assert ups[1].one_pass() == 1
    ckpts = {c.name: c for c in store.checkpoints()}
    assert ckpts["latest"].pointer == "global_step4" and ckpts["zero_to_fp32.py"].pointer is None
    assert not ckpts["global_step4"].complete and ckpts["global_step2"].complete
    for node, root in ((1, n1), (0, n0)):
        doc = cmd_restore(store, node, root, jobs / str(node))
        assert (doc["name"], doc["pointers"]) == ("global_step2", ["latest"]), doc
        assert (root / "latest").read_text() == "global_step2"
        assert sorted(p.name for p in (root / "global_step2").iterdir()) == [
            "mp_rank_00_model_states.pt", "zero_pp_rank_0_optim_states.pt", "zero_pp_rank_1_optim_states.pt"]
        assert json.loads((jobs / str(node) / "ckpt-restored.json").read_text())["name"] == "global_step2"
    # node 0 held the partial step 4: set aside, out of a trainer's way and the uploader's, kept
    assert doc["set_aside"] == ["global_step4"] and not (n0 / "global_step4").exists()
    (kept,) = (n0 / PARTIAL).glob("global_step4-*[0-9]")
    assert (kept / "zero_pp_rank_0_optim_states.pt").read_text() == "shard 0 at 4"
    assert not (n0 / "global_step4.done").exists()
    # a pull takes every whole checkpoint and `latest` as the store has it, then makes it name the newest pulled
    pulled = tmp_path / "pulled"
    pull_from_store(SimpleNamespace(id="j", info={"checkpoint_store": store.where.rsplit("/c/run-2", 1)[0],  # type: ignore[arg-type]
                                                  "checkpoint_key": "c/run-2"}), pulled)
    assert (pulled / "latest").read_text() == "global_step2" and not (pulled / "global_step4").exists()
    # node 1 writes its part of step 4 late: step 4 is whole, restored, and `latest` follows it
    _step(n1, 1, 4, t + 4.3)
    (n1 / "global_step4.done").write_text("")
    assert ups[1].one_pass() >= 1
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    doc = cmd_restore(store, 1, fresh, jobs / "1")
    assert doc["name"] == "global_step4" and (fresh / "latest").read_text() == "global_step4"
    store.close()


def test_the_flush_after_a_stop_takes_what_was_written_last_and_an_unstored_newer_step_is_set_aside(
        moto_server: str, tmp_path: Path, monkeypatch: Any) -> None:
    """Hugging Face's ``checkpoint-N/`` folders, per-rank files. The ranks are stopped a moment after both nodes
    wrote checkpoint-4 (the uploaders had not yet seen it settle): the flush after the stop waits the settle
    time out and uploads it, where it used to skip it as "still being written" and the run went back to
    checkpoint-2. And a node holding a newer step the store never got (checkpoint-6: its upload never
    happened) sets it aside at restore, so a trainer taking the highest number resumes from what was restored."""
    from gtrain.checkpoints.node import main as tool

    url = bucket(moto_server, "steps-flush")
    monkeypatch.setenv("GTRAIN_CHECKPOINT_SETTLE_S", "1.5")
    roots = [tmp_path / "n0", tmp_path / "n1"]
    jobs = [tmp_path / "j0", tmp_path / "j1"]
    t = time.time() - 100
    for node, root in enumerate(roots):
        jobs[node].mkdir()
        _write(root, f"checkpoint-2/rng_state_{node}.pth", f"rank {node} at 2", t)
        if node == 0:
            _write(root, "checkpoint-2/model.bin", "weights at 2", t)
        assert tool(["flush", url, "c/run-3", str(node), str(root), str(jobs[node]), "1", "0"]) == 0
    now = time.time()
    for node, root in enumerate(roots):
        _write(root, f"checkpoint-4/rng_state_{node}.pth", f"rank {node} at 4", now)
        if node == 0:
            _write(root, "checkpoint-4/model.bin", "weights at 4", now)
    t0 = time.monotonic()
    for node, root in enumerate(roots):  # the stopped job's flush (RC 143), as a recovery's collect runs it
        assert tool(["flush", url, "c/run-3", str(node), str(root), str(jobs[node]), "1", "143"]) == 0
    assert time.monotonic() - t0 < 5  # the settle time waited out once, not skipped, not more
    store = Store(url, "c/run-3")
    assert [(c.name, c.complete) for c in store.checkpoints()] == [("checkpoint-2", True), ("checkpoint-4", True)]
    _write(roots[1], "checkpoint-6/rng_state_1.pth", "rank 1 at 6", time.time() + 1)  # never uploaded
    fresh = [tmp_path / "r0", roots[1]]
    for node, root in enumerate(fresh):
        doc = cmd_restore(store, node, root, jobs[node])
        assert doc["name"] == "checkpoint-4", doc
        newest = max(int(p.name.split("-")[1]) for p in root.glob("checkpoint-*"))  # transformers' rule
        assert newest == 4, sorted(p.name for p in root.iterdir())
    assert doc["set_aside"] == ["checkpoint-6"]
    (kept,) = (roots[1] / PARTIAL).glob("checkpoint-6-*")
    assert (kept / "rng_state_1.pth").read_text() == "rank 1 at 6"
    store.close()
