"""Store.restore against moto's S3: a sharded checkpoint of two nodes, restored with the listing its
checkpoints() made and (for a checkpoint found by another Store) with a fresh one; many manifests read at once
give the same answer as one at a time."""

from __future__ import annotations

import hashlib
from pathlib import Path

from gtrain.checkpoints.store import Store


def _bucket(name: str) -> str:
    import boto3

    boto3.client("s3").create_bucket(Bucket=name)
    return f"s3://{name}/runs"


def test_restore_of_a_sharded_two_node_checkpoint_with_either_listing(moto_server: str, tmp_path: Path) -> None:
    url = _bucket("ckpt-shards")
    writer = Store(url, "job-s")
    shards: dict[str, bytes] = {}
    for node in (0, 1):
        root = tmp_path / f"n{node}"
        (root / "step-4").mkdir(parents=True)
        files = []
        for k in range(6):
            rel = f"step-4/shard-{node}-{k}.pt"
            shards[rel] = hashlib.sha256(rel.encode()).digest() * (k + 1)
            (root / rel).write_bytes(shards[rel])
            files.append(rel)
        writer.upload(node, root, "step-4", files)
    for step in range(1, 40):  # many older checkpoints: many manifests to read
        (tmp_path / "n0" / f"old-{step:02d}.pt").write_bytes(b"%d" % step)
        writer.upload(step % 2, tmp_path / "n0", f"old-{step:02d}.pt", [f"old-{step:02d}.pt"])
    found = Store(url, "job-s")
    ckpts = found.checkpoints()
    assert len(ckpts) == 40 and all(c.complete for c in ckpts)
    step4 = next(c for c in ckpts if c.name == "step-4")
    assert sorted(step4.manifests) == [0, 1] and step4.bytes == sum(len(b) for b in shards.values())
    # with the listing checkpoints() just made
    got, kept, nbytes = found.restore(step4, tmp_path / "a")
    assert sorted(got) == sorted(shards) and kept == [] and nbytes == step4.bytes
    assert all((tmp_path / "a" / rel).read_bytes() == data for rel, data in shards.items())
    # a checkpoint another Store found (this one has listed nothing): it lists for itself
    fresh = Store(url, "job-s")
    got, kept, _ = fresh.restore(step4, tmp_path / "b")
    assert sorted(got) == sorted(shards) and kept == []
    assert all((tmp_path / "b" / rel).read_bytes() == data for rel, data in shards.items())
    for st in (writer, found, fresh):
        st.close()
