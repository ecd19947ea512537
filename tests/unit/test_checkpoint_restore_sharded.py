"""What a restore puts on a node of a sharded run (gtrain/checkpoints/node.py ``restore_mode``,
gtrain/checkpoints/sharded.py ``node_reads``): the whole step by default; with ``GTRAIN_CHECKPOINT_RESTORE=subset``
and the shape that wrote the step, DCP's metadata and the files it assigns to this node's ranks; another shape, a
missing or unreadable metadata, or a node whose ranks read every file: the whole step.

The metadata are real, written by torch 2.13's ``dcp.save`` (tests/unit/golden/dcp/):

- ``fsdp2-adamw-4ranks.metadata``: tests/integration/jobs/fsdp_dcp_train.py (FSDP2 + AdamW) on 1 x 4 processes,
  ``step-2``. What each rank's ``dcp.load`` opened (``FileSystemReader.read_data`` spied on, 4 processes) is
  ``READS`` below: DCP's save dedup gave the replicated items (AdamW's ``step`` scalars, ``param_groups``) to ranks
  1-3, so every rank reads their files, and only ``__0_0`` (rank 0's shards alone) is rank 0's own;
- ``dtensor-4ranks.metadata``: three ``distribute_tensor(..., [Shard(0)])`` tensors over 4 ranks (nothing
  replicated: each rank reads its own file);
- ``rank-local-__R.metadata``: fsdp_dcp_train.py with ``DCP_RANK_LOCAL=1`` (``use_collectives=False``) on 2
  processes: each rank's ``__R.metadata`` names its own file only.
"""

from __future__ import annotations

import builtins
import hashlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gtrain.checkpoints.node import cmd_restore
from gtrain.checkpoints.sharded import describe
from gtrain.checkpoints.store import Store
from gtrain.checkpoints.subset import dcp_items, dcp_rank_reads, node_ranks, node_reads
from gtrain.sync.model import Digests, RemoteObject, RemoteURL

GOLDEN = Path(__file__).parent / "golden" / "dcp"
FSDP = (GOLDEN / "fsdp2-adamw-4ranks.metadata").read_bytes()
DTENSOR = (GOLDEN / "dtensor-4ranks.metadata").read_bytes()
READS = {0: ["__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"],
         1: ["__1_0.distcp", "__2_0.distcp", "__3_0.distcp"],
         2: ["__1_0.distcp", "__2_0.distcp", "__3_0.distcp"],
         3: ["__1_0.distcp", "__2_0.distcp", "__3_0.distcp"]}


def test_the_files_a_rank_reads_are_those_dcp_load_opened() -> None:
    items = dcp_items(FSDP)
    assert items is not None
    for rank, want in READS.items():
        assert dcp_rank_reads(items, {rank}, 4) == (want, ""), rank
    assert dcp_rank_reads(items, {2, 3}, 4) == (READS[2], "")  # node 1 of 2 x 2: 3 of the 4 data files
    plain = dcp_items(DTENSOR)
    assert plain is not None
    assert [dcp_rank_reads(plain, {r}, 4)[0] for r in range(4)] == [[f"__{r}_0.distcp"] for r in range(4)]


def _manifests(name: str, parts: dict[int, list[str]]) -> dict[int, dict[str, Any]]:
    return {n: {"files": [{"path": f"{name}/{f}"} for f in fs]} for n, fs in parts.items()}


TWO_BY_TWO = _manifests("step-2", {0: [".metadata", "__0_0.distcp", "__1_0.distcp"],
                                   1: ["__2_0.distcp", "__3_0.distcp"]})


def test_same_shape_gives_the_metadata_and_the_ranks_files() -> None:
    got = node_reads("step-2", TWO_BY_TWO, 1, {2, 3}, 4, FSDP)
    assert got == (["step-2/.metadata", *(f"step-2/{f}" for f in READS[2])], "")
    plain = node_reads("step-2", TWO_BY_TWO, 1, {2, 3}, 4, DTENSOR)
    assert plain == (["step-2/.metadata", "step-2/__2_0.distcp", "step-2/__3_0.distcp"], "")


@pytest.mark.parametrize(("node", "ranks", "world", "why"), [
    (0, {0, 1, 2, 3}, 4, "this node's part of step-2 was written by rank(s) 0-1, this node runs rank(s) 0-3"),  # 1x4
    (1, {1}, 4, "written by rank(s) 2-3, this node runs rank(s) 1 "),  # 4 x 1: the same world, another shape
    (1, {2, 3}, 6, "the step was written by 4 ranks, this run has 6"),  # grown to 3 x 2, node 1 keeps its ranks
    (1, {4, 5}, 6, "written by rank(s) 2-3, this node runs rank(s) 4-5"),
])
def test_another_shape_gives_the_whole_step(node: int, ranks: set[int], world: int, why: str) -> None:
    files, said = node_reads("step-2", TWO_BY_TWO, node, ranks, world, FSDP)
    assert files is None and why in said, said


def test_a_missing_or_unreadable_metadata_gives_the_whole_step() -> None:
    assert node_reads("step-2", TWO_BY_TWO, 1, {2, 3}, 4, None) == (
        None, ".metadata could not be read as DCP's Metadata")
    assert node_reads("step-2", TWO_BY_TWO, 1, {2, 3}, 4, b"not a pickle")[0] is None
    zero = _manifests("global_step4", {0: ["zero_pp_rank_0_mp_rank_00_optim_states.pt"],
                                       1: ["zero_pp_rank_1_mp_rank_00_optim_states.pt"]})
    assert node_reads("global_step4", zero, 1, {1}, 2, None)[0] is None


def test_coordinator_less_dcp_gives_each_rank_its_own_metadata_and_file(tmp_path: Path) -> None:
    step = tmp_path / "step-2"
    step.mkdir()
    for r in (0, 1):
        shutil.copy(GOLDEN / f"rank-local-__{r}.metadata", step / f"__{r}.metadata")
        (step / f"__{r}_0.distcp").write_bytes(b"x")
    parts: dict[int, dict[str, Any]] = {}
    for r in (0, 1):
        files = [f"step-2/__{r}.metadata", f"step-2/__{r}_0.distcp"]
        parts[r] = {"files": [{"path": f} for f in files], **describe(tmp_path, "step-2", files)}
    assert node_reads("step-2", parts, 1, {1}, 2, None) == (["step-2/__1.metadata", "step-2/__1_0.distcp"], "")
    assert node_reads("step-2", parts, 0, {0, 1}, 2, None)[0] is None  # 1 x 2 now: node 0 runs both ranks


def test_the_ranks_come_from_torchrun_in_a_rank_else_from_the_shape() -> None:
    assert node_ranks(1, {"GTRAIN_NUM_NODES": "2", "GTRAIN_NPROC_PER_NODE": "2"}) == ({2, 3}, 4)
    # an elastic round (rank.sh): torchrun's numbering, whatever the node's index
    elastic = {"RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2",
               "GTRAIN_NUM_NODES": "3", "GTRAIN_NPROC_PER_NODE": "2"}
    assert node_ranks(2, elastic) == ({0, 1}, 2)
    assert node_ranks(0, {"GTRAIN_NUM_NODES": "2", "GTRAIN_NPROC_PER_NODE": "auto"}) is None
    assert node_ranks(3, {"GTRAIN_NUM_NODES": "2", "GTRAIN_NPROC_PER_NODE": "2"}) is None


class _Memory:
    """A store in memory: what Store needs of a backend."""

    def __init__(self) -> None:
        self.objs: dict[str, bytes] = {}

    def list(self, url: RemoteURL) -> Iterator[RemoteObject]:
        for k, v in sorted(self.objs.items()):
            if k.startswith(url.key_prefix):
                yield RemoteObject(k, len(v), hashlib.md5(v).hexdigest())  # noqa: S324 - a version tag

    def upload(self, path: Path, url: RemoteURL, key: str, *, size: int, digests: Digests,
               expect: RemoteObject | None, progress: Callable[[int], None]) -> RemoteObject:
        self.objs[key] = path.read_bytes()
        return RemoteObject(key, size, "v")

    def download(self, url: RemoteURL, obj: RemoteObject, dest: Path, *,
                 progress: Callable[[int], None]) -> tuple[RemoteObject, Digests | None]:
        dest.write_bytes(self.objs[obj.key])
        return obj, None

    def delete(self, url: RemoteURL, keys: builtins.list[str]) -> None:
        for k in keys:
            self.objs.pop(k, None)

    def close(self) -> None:
        return None


@pytest.fixture
def store(tmp_path: Path) -> Store:
    """step-2 of 2 x 2 (the real FSDP2 + AdamW .metadata; data files of 1 KiB each) uploaded by both nodes."""
    st = Store("s3://bench/runs", "c/run-1", backend=_Memory())  # type: ignore[arg-type]
    for node, names in {0: [".metadata", "__0_0.distcp", "__1_0.distcp"], 1: ["__2_0.distcp", "__3_0.distcp"]}.items():
        root = tmp_path / f"wrote-{node}"
        (root / "step-2").mkdir(parents=True)
        for n in names:
            (root / "step-2" / n).write_bytes(FSDP if n == ".metadata" else n.encode() * 80)
        files = [f"step-2/{n}" for n in names]
        st.upload(node, root, "step-2", files, extra=describe(root, "step-2", files))
    return st


SHAPE = {"GTRAIN_NUM_NODES": "2", "GTRAIN_NPROC_PER_NODE": "2"}


def test_a_subset_restore_fetches_what_the_nodes_ranks_read(store: Store, tmp_path: Path) -> None:
    dest, job = tmp_path / "ckpt", tmp_path / "job"
    dest.mkdir()
    job.mkdir()
    doc = cmd_restore(store, 1, dest, job, env={**SHAPE, "GTRAIN_CHECKPOINT_RESTORE": "subset"})
    assert doc["mode"] == "subset" and doc["name"] == "step-2", doc
    assert "rank(s) 2-3 of 4 read 4 of its 5 files" in str(doc["why"]), doc
    assert sorted(p.name for p in (dest / "step-2").iterdir()) == [".metadata", *READS[2]]
    assert (doc["files"], doc["kept"]) == (4, 0)
    # again: every file is there with its sha256, nothing is fetched
    again = cmd_restore(store, 1, dest, job, env={**SHAPE, "GTRAIN_CHECKPOINT_RESTORE": "subset"})
    assert (again["files"], again["kept"], again["bytes"]) == (0, 4, 0)


def test_node_0_of_the_same_step_needs_every_file(store: Store, tmp_path: Path) -> None:
    doc = cmd_restore(store, 0, tmp_path, tmp_path, env={**SHAPE, "GTRAIN_CHECKPOINT_RESTORE": "subset"})
    assert doc["mode"] == "whole" and "read every file of the step" in str(doc["why"]), doc
    assert doc["files"] == 5


@pytest.mark.parametrize(("env", "why"), [
    (SHAPE, "the default"),
    ({"GTRAIN_NUM_NODES": "1", "GTRAIN_NPROC_PER_NODE": "4", "GTRAIN_CHECKPOINT_RESTORE": "subset"},
     "this node's part of step-2 was written by rank(s) 0-1, this node runs rank(s) 0-3"),
    ({"GTRAIN_CHECKPOINT_RESTORE": "subset"}, "this node's ranks are not known"),
    ({**SHAPE, "GTRAIN_CHECKPOINT_RESTORE": "some"}, "'some' is none of whole, subset"),
])
def test_whole_step_restores_say_why(store: Store, tmp_path: Path, env: dict[str, str], why: str) -> None:
    doc = cmd_restore(store, 0 if env.get("GTRAIN_NUM_NODES") == "1" else 1, tmp_path, tmp_path, env=env)
    assert doc["mode"] == "whole" and why in str(doc["why"]), doc
    assert doc["files"] == 5


def test_a_nodes_rank_pieces_are_written_compact_and_read_back_as_before(tmp_path: Path) -> None:
    from gtrain.checkpoints.sharded import dcp_rank_metadata, missing, rank_chunks

    step = tmp_path / "step-2"
    step.mkdir()
    for r in (0, 1):
        shutil.copy(GOLDEN / f"rank-local-__{r}.metadata", step / f"__{r}.metadata")
        (step / f"__{r}_0.distcp").write_bytes(b"x")
    files = ["step-2/__0.metadata", "step-2/__0_0.distcp", "step-2/__1.metadata", "step-2/__1_0.distcp"]
    doc: dict[str, Any] = {"files": [{"path": f} for f in files], **describe(tmp_path, "step-2", files)}  # 2 ranks
    for rk in ("0", "1"):
        assert rank_chunks(doc, doc["dcp_ranks"][rk]) == {  # the long form, non-tensors left out
            k: v for k, v in (dcp_rank_metadata(step / f"__{rk}.metadata") or {})["chunks"].items() if v is not None}
    assert missing("step-2", {0: doc}) == ("dcp", [])
    one = {"files": doc["files"][:2], "dcp_keys": doc["dcp_keys"], "dcp_ranks": {"0": doc["dcp_ranks"]["0"]}}
    assert missing("step-2", {0: one}) == ("dcp", ["step-2/__1.metadata"])  # rank 1's rows of each tensor: nowhere
