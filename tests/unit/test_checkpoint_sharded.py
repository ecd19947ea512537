"""The completeness rule of sharded step folders (gtrain/checkpoints/sharded.py) over the store's listings: a
DCP step is whole with ``.metadata`` and every shard it names; without ``.metadata``, or with a shard it names
missing, it is not and the previous whole step is the one restored; DeepSpeed ZeRO needs every rank's shard.
``.metadata`` is read without torch (a real one, written by ``dcp.save``)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

from gtrain.checkpoints.node import complete, entries
from gtrain.checkpoints.sharded import dcp_data_files, dcp_finished, missing, requires, zero_world
from gtrain.checkpoints.store import Checkpoint, restorable


def _manifest(node: int, paths: list[str], t: float, req: list[str] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"node": node, "files": [{"path": p, "size": 1, "sha256": "0" * 64, "mtime": t}
                                                   for p in paths], "mtime": t, "written_at": t}
    if req is not None:
        doc["requires"] = req
    return doc


def _ckpt(name: str, parts: dict[int, dict[str, Any]], expected: set[int] | None = None) -> Checkpoint:
    return Checkpoint(name, manifests=parts, writers=set(parts), expected=expected or set())


DCP4 = [f"__{r}_0.distcp" for r in range(4)]


def _dcp_step(step: int, *, meta: bool = True, nodes: tuple[int, ...] = (0, 1), names: list[str] = DCP4
              ) -> Checkpoint:
    """Node 0: ranks 0-1 and (``meta``) ``.metadata`` naming ``names``; node 1: ranks 2-3."""
    name = f"step-{step}"
    parts = {}
    for node in nodes:
        files = [f"{name}/__{r}_0.distcp" for r in (2 * node, 2 * node + 1)]
        req = None
        if node == 0 and meta:
            files.append(f"{name}/.metadata")
            req = [f"{name}/{n}" for n in names]
        parts[node] = _manifest(node, files, float(step), req)
    return _ckpt(name, parts, expected={0, 1})


def test_dcp_step_complete_with_metadata_and_every_shard_it_names() -> None:
    c = _dcp_step(20)
    assert c.lacks == ("dcp", []) and c.complete


def test_dcp_step_without_metadata_is_not_complete() -> None:
    c = _dcp_step(20, meta=False)
    assert c.lacks == ("dcp", ["step-20/.metadata"]) and not c.complete


def test_dcp_step_whose_metadata_names_a_shard_not_in_the_store_is_not_complete() -> None:
    only0 = _dcp_step(20, nodes=(0,))  # node 1's part never reached the store
    assert only0.lacks == ("dcp", ["step-20/__2_0.distcp", "step-20/__3_0.distcp"]) and not only0.complete
    more = _dcp_step(20, names=[*DCP4, "__4_0.distcp"])  # names a shard no node uploaded
    assert more.lacks == ("dcp", ["step-20/__4_0.distcp"]) and not more.complete


def test_the_previous_complete_dcp_step_is_the_one_restored() -> None:
    ckpts = [_dcp_step(10), _dcp_step(20, meta=False), _dcp_step(30, nodes=(0,))]
    assert [c.name for c in restorable(ckpts)] == ["step-10"]


def test_dcp_metadata_alone_decides_not_the_previous_steps_writers() -> None:
    """``.metadata`` names every rank's part: a run resumed on fewer nodes (DCP reshards on load) writes
    whole steps at once."""
    name = "step-40"
    files = [f"{name}/__0_0.distcp", f"{name}/__1_0.distcp", f"{name}/.metadata"]
    c = _ckpt(name, {0: _manifest(0, files, 40.0, [f"{name}/__0_0.distcp", f"{name}/__1_0.distcp"])},
              expected={0, 1})
    assert c.complete
    c.writers.add(1)  # node 1 has objects under it but no manifest yet: still uploading
    assert not c.complete


def test_zero_step_needs_every_ranks_shard_and_the_model_states() -> None:
    def part(node: int, step: int, model: bool = True) -> dict[str, Any]:
        name = f"global_step{step}"
        files = [f"{name}/zero_pp_rank_{node}_mp_rank_00_optim_states.pt"]
        if node == 0 and model:
            files.append(f"{name}/mp_rank_00_model_states.pt")
        return _manifest(node, files, float(step))

    whole = _ckpt("global_step4", {0: part(0, 4), 1: part(1, 4)}, expected={0, 1})
    assert whole.lacks == ("zero", []) and whole.complete
    gap = _ckpt("global_step6", {1: part(1, 6)}, expected={0, 1})
    assert gap.lacks == ("zero", ["global_step6/mp_rank_00_model_states.pt",
                                  "global_step6/zero_pp_rank_0_mp_rank_00_optim_states.pt"])
    assert not gap.complete
    slow = _ckpt("global_step8", {0: part(0, 8)}, expected={0, 1})  # node 1 (rank 1) has not written its shard
    assert slow.lacks == ("zero", []) and not slow.complete  # the previous step's writers decide
    latest = _ckpt("latest", {0: {**_manifest(0, ["latest"], 8.0), "points_to": "global_step8"}})
    assert [c.name for c in restorable([whole, gap, slow, latest])] == ["global_step4"]


def test_other_step_folders_keep_the_previous_writers_rule() -> None:
    c = _ckpt("checkpoint-4", {0: _manifest(0, ["checkpoint-4/model.bin"], 4.0)}, expected={0, 1})
    assert c.lacks == (None, None) and not c.complete
    assert missing("ckpt.pt", {0: _manifest(0, ["ckpt.pt"], 1.0)}) == (None, None)


def _dcp_save(root: Path) -> Path:
    """A real DCP checkpoint of two shards (``dcp.save`` in a child process: torch stays out of this one)."""
    code = ("import sys, torch, torch.distributed.checkpoint as dcp\n"
            "from torch.distributed.checkpoint.filesystem import FileSystemWriter\n"
            "sd = {'w': torch.arange(12.0).reshape(3, 4), 'opt': {'step': torch.tensor(3.0), 'lr': 0.1}}\n"
            "dcp.save(sd, storage_writer=FileSystemWriter(sys.argv[1], per_thread_copy_ahead=0, thread_count=2),"
            " no_dist=True)\n")
    subprocess.run([sys.executable, "-c", code, str(root / "step-3")], check=True, timeout=120)
    return root / "step-3"


def test_dcp_metadata_is_read_without_torch_and_uploaded_with_its_step(tmp_path: Path) -> None:
    step = _dcp_save(tmp_path)
    on_disk = sorted(p.name for p in step.glob("*.distcp"))
    assert len(on_disk) == 2
    assert dcp_data_files(step / ".metadata") == on_disk
    (step / ".metadata.tmp").write_bytes(b"half")  # DCP's temp name while it writes: never uploaded
    (step / ".hidden").write_bytes(b"x")
    files = entries(tmp_path)["step-3"]
    assert sorted(files) == sorted(["step-3/.metadata", *(f"step-3/{n}" for n in on_disk)])
    assert requires(tmp_path, "step-3", files) == [f"step-3/{n}" for n in on_disk]
    # .metadata written last: the writer finished, no settle time to wait
    assert complete(tmp_path, "step-3", files, settle_s=3600, final=False)
    # a pickle of another shape: its strings that name data files
    odd = tmp_path / "odd.metadata"
    odd.write_bytes(pickle.dumps({"x": ["__0_0.distcp", "__1_0.distcp"]}))
    assert dcp_data_files(odd) == ["__0_0.distcp", "__1_0.distcp"]
    (tmp_path / "junk").write_bytes(b"not a pickle")
    assert dcp_data_files(tmp_path / "junk") is None


def test_a_dcp_shard_folder_without_metadata_waits_for_the_settle_time(tmp_path: Path) -> None:
    (tmp_path / "step-5").mkdir()
    (tmp_path / "step-5" / "__2_0.distcp").write_bytes(b"shard")
    files = entries(tmp_path)["step-5"]
    assert not complete(tmp_path, "step-5", files, settle_s=3600, final=False)
    assert requires(tmp_path, "step-5", files) is None


def test_zero_families_keep_their_bf16_prefix_in_the_gap_rule() -> None:
    name = "global_step2"
    files = [f"{name}/mp_rank_00_model_states.pt", f"{name}/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
             f"{name}/bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt"]
    c = _ckpt(name, {0: _manifest(0, files, 2.0)})
    assert c.lacks == ("zero", [f"{name}/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"])


def test_zero_world_from_the_model_states_replaces_the_previous_writers_rule() -> None:
    """The node holding the model states names every rank's file (``requires``, from their dp_world_size):
    then that decides, not the nodes that wrote the previous step (a run resumed on one node)."""
    name = "global_step10"
    req = [f"{name}/mp_rank_00_model_states.pt", f"{name}/zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    one = _ckpt(name, {0: _manifest(0, req, 10.0, req)}, expected={0, 1})
    assert one.lacks == ("zero", []) and one.complete
    two = [*req, f"{name}/zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    short = _ckpt(name, {0: _manifest(0, req, 10.0, two)}, expected={0})  # rank 1's file never came
    assert short.lacks == ("zero", [two[-1]]) and not short.complete


def _rank_part(name: str, rank: int, rows: int, world: int, *, meta: bool = True) -> dict[str, Any]:
    """Rank ``rank``'s pieces of a (rows x 4) tensor split by rows over ``world`` ranks, as describe() gives."""
    per = rows // world
    info = {"files": [f"__{rank}_0.distcp"],
            "chunks": {"w": [[rows, 4], [[[rank * per, 0], [per, 4]]]], "step": [[], [[[], []]]], "extra": None}}
    files = [f"{name}/__{rank}_0.distcp"] + ([f"{name}/__{rank}.metadata"] if meta else [])
    doc = _manifest(rank, files, 5.0)
    if meta:
        doc["dcp_ranks"] = {str(rank): info}
    return doc


def test_dcp_without_a_coordinator_is_whole_when_every_rank_metadata_covers_the_tensors() -> None:
    name = "step-5"
    whole = _ckpt(name, {r: _rank_part(name, r, 8, 2) for r in (0, 1)}, expected={0, 1, 2})
    assert whole.lacks == ("dcp", []) and whole.complete  # the pieces cover: the previous writers do not decide
    top = _ckpt(name, {0: _rank_part(name, 0, 8, 2)})  # rank 1 wrote nothing: rows 4..7 of w are nowhere
    assert top.lacks == ("dcp", [f"{name}/__1.metadata"]) and not top.complete
    gap = _ckpt(name, {r: _rank_part(name, r, 12, 3) for r in (0, 2)})
    assert gap.lacks == ("dcp", [f"{name}/__1.metadata"]) and not gap.complete
    half = _ckpt(name, {0: _rank_part(name, 0, 8, 2), 1: _rank_part(name, 1, 8, 2, meta=False)})
    assert half.lacks == ("dcp", [f"{name}/__1.metadata"]) and not half.complete  # its data, no metadata yet
    unread = _rank_part(name, 1, 8, 2)
    del unread["dcp_ranks"]  # a __1.metadata the uploader could not read: no rule, the previous writers decide
    odd = _ckpt(name, {0: _rank_part(name, 0, 8, 2), 1: unread}, expected={0, 1})
    assert odd.lacks == ("dcp", None) and odd.complete


def test_a_rank_local_dcp_part_is_finished_once_each_ranks_metadata_follows_its_data(tmp_path: Path) -> None:
    import os

    step = tmp_path / "step-5"
    step.mkdir()
    for n in ("__0_0.distcp", "__1_0.distcp", "__0.metadata"):
        (step / n).write_bytes(b"x")
    os.utime(step / "__0_0.distcp", (100, 100))
    os.utime(step / "__1_0.distcp", (100, 100))
    os.utime(step / "__0.metadata", (200, 200))
    files = entries(tmp_path)["step-5"]
    assert not dcp_finished(tmp_path, "step-5", files)  # rank 1 has not written its metadata
    (step / "__1.metadata").write_bytes(b"x")
    os.utime(step / "__1.metadata", (200, 200))
    assert dcp_finished(tmp_path, "step-5", entries(tmp_path)["step-5"])


def test_the_world_size_is_read_from_a_torch_zip_without_torch(tmp_path: Path) -> None:
    """A model states file as ``torch.save`` writes it (a zip; a state_dict OrderedDict with ``_metadata``):
    its ``dp_world_size`` / ``mp_world_size`` come out with no tensor loaded (torch stays out of this process)."""
    path = tmp_path / "mp_rank_00_model_states.pt"
    code = ("import sys, torch\n"
            "net = torch.nn.Linear(3, 2)\n"
            "torch.save({'module': net.state_dict(), 'dp_world_size': 4, 'mp_world_size': 2, 'ds_version': '0'},"
            " sys.argv[1])\n")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=120)
    assert zero_world(path) == (4, 2)
    (tmp_path / "legacy.pt").write_bytes(pickle.dumps({"dp_world_size": 4}))
    assert zero_world(tmp_path / "legacy.pt") is None


def test_zero_files_outside_requires_keep_the_previous_writers_rule() -> None:
    name = "global_step12"
    req = [f"{name}/mp_rank_00_model_states.pt", f"{name}/zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    pipe = _ckpt(name, {0: _manifest(0, [*req, f"{name}/layer_01-model_states.pt"], 12.0, req)}, expected={0, 1})
    assert pipe.lacks == ("zero", []) and not pipe.complete  # a pipeline stage's layer file: node 1 may hold more
