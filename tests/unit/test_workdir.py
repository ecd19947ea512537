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


CORPUS_FILES = ["train.py", "data/raw/a.csv", "data/raw/b.csv", "data/prepared/train.bin", "data/prepared/x.tmp",
                "logs/run.log", "logs/keep/summary.log", "src/build/out.o", "src/main.py", "src/gen/a.pyc",
                "src/gen/keep.pyc", "docs/a.md", "docs/private/notes.md", "docs/private/public.md", "deep/a/b/c.bin",
                "deep/a/b/keep.bin", "deep/z.bin", "root.bin", "sub/root.bin", "sp ace/f.txt", "#hash.txt",
                "weird[1].txt", "trail.txt"]
CORPUS_IGNORES = {
    ".gitignore": "data/\n!data/prepared/\n*.log\n!logs/keep/\n/root.bin\nsrc/build\n*.pyc\n#comment\n\\#hash.txt\n"
                  "deep/**/*.bin\nweird\\[1\\].txt\ntrail.txt   \n",
    "data/.gitignore": "!prepared/\n",
    "data/prepared/.gitignore": "*.tmp\n",
    "logs/.gitignore": "!keep/summary.log\n",
    "src/gen/.gitignore": "!keep.pyc\n",
    "docs/.gitignore": "private/*\n!private/public.md\n",
    "deep/a/.gitignore": "!b/keep.bin\n",
}


def _corpus(root: Path, ignore_name: str) -> None:
    for f in CORPUS_FILES:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(f)
    for f, text in CORPUS_IGNORES.items():
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(text)
        if ignore_name != ".gitignore":
            (root / f).rename((root / f).with_name(ignore_name))


def test_the_workdir_keeps_what_git_keeps_on_a_corpus_with_negations(tmp_path: Path) -> None:
    import subprocess

    _corpus(tmp_path, ".gitignore")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    every = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                   if p.is_file() and ".git" not in p.relative_to(tmp_path).parts[:1])
    r = subprocess.run(["git", "-C", str(tmp_path), "check-ignore", "--stdin", "-z"], input="\0".join(every),
                       capture_output=True, text=True)
    assert r.returncode in (0, 1), r.stderr
    git_ignored = {p for p in r.stdout.split("\0") if p}
    want = sorted(set(every) - git_ignored)
    assert "logs/keep/summary.log" in want and "src/gen/keep.pyc" in want and "deep/a/b/keep.bin" in want
    assert list_workdir(tmp_path) == want
    # the same files named .gtrainignore: the same verdicts
    other = tmp_path / "g"
    other.mkdir()
    _corpus(other, ".gtrainignore")
    assert list_workdir(other) == [p.replace(".gitignore", ".gtrainignore") for p in want]
