"""Which files of a workdir go to the nodes: everything except ``.git/``, what ``.gitignore`` and
``.gtrainignore`` files (at any depth, with git's semantics: pathspec's gitwildmatch, the last matching
pattern wins, deeper files after shallower ones, ``.gtrainignore`` after ``.gitignore``) exclude, and
gtrain's own pull folders: any folder below the workdir that holds a ``.gtrain-pull`` marker (``gtrain pull``
writes one into every DEST it creates, e.g. the default ``./<cluster>-checkpoints``), so pulled checkpoints
are never uploaded back to the nodes."""

from __future__ import annotations

import os
from pathlib import Path

IGNORE_FILES = (".gitignore", ".gtrainignore")
ALWAYS_SKIP = {".git", ".hg", ".svn", "__pycache__", ".gtrain-partial"}
PULL_MARKER = ".gtrain-pull"  # written by gtrain pull into a folder it creates


def list_workdir(root: Path) -> list[str]:
    import pathspec

    root = root.resolve()
    out: list[str] = []
    # (directory relative to root, spec) for every ignore file seen on the way down
    specs: list[tuple[str, pathspec.GitIgnoreSpec]] = []

    def ignored(rel: str, is_dir: bool) -> bool:
        # as git: the last pattern that matches decides, a deeper file's patterns coming after its parents'
        # (so a deeper `!pattern` re-includes what a shallower file excluded); an excluded folder is not entered
        verdict = False
        for base, spec in specs:
            if base and not rel.startswith(base + "/"):
                continue
            sub = rel[len(base) + 1:] if base else rel
            res = spec.check_file(sub + ("/" if is_dir else ""))
            if res.include is not None:
                verdict = bool(res.include)
        return verdict

    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        rel_dir = "" if rel_dir == "." else rel_dir
        for name in IGNORE_FILES:
            if name in filenames:
                lines = (Path(dirpath) / name).read_text(encoding="utf-8", errors="replace").splitlines()
                specs.append((rel_dir, pathspec.GitIgnoreSpec.from_lines(lines)))
        keep = []
        for d in sorted(dirnames):
            rel = f"{rel_dir}/{d}" if rel_dir else d
            full = os.path.join(dirpath, d)
            if (d in ALWAYS_SKIP or os.path.islink(full) or os.path.lexists(os.path.join(full, PULL_MARKER))
                    or ignored(rel, True)):
                continue
            keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            rel = f"{rel_dir}/{f}" if rel_dir else f
            full = os.path.join(dirpath, f)
            if not os.path.isfile(full) or ignored(rel, False):
                continue
            out.append(rel)
    return sorted(out)
