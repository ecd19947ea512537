from __future__ import annotations

from pathlib import Path

from gtrain.sync.workdir import list_workdir


def test_gitignore_and_gtrainignore_at_any_depth(tmp_path: Path) -> None:
    files = ["train.py", "data/a.bin", "data/keep.txt", "out/x.log", "sub/deep/y.tmp", "sub/deep/z.py",
             ".git/config", "__pycache__/m.pyc", "sub/local.ckpt"]
    for f in files:
        p = tmp_path / f
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f)
    (tmp_path / ".gitignore").write_text("out/\n*.tmp\n")
    (tmp_path / ".gtrainignore").write_text("data/*\n!data/keep.txt\n")
    (tmp_path / "sub" / ".gitignore").write_text("*.ckpt\n")
    got = list_workdir(tmp_path)
    assert got == [".gitignore", ".gtrainignore", "data/keep.txt", "sub/.gitignore", "sub/deep/z.py", "train.py"]
