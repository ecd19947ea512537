"""gtrain's layers and import graph are checked by import-linter (``lint-imports``; the contracts in
pyproject.toml's ``[tool.importlinter]``): the layers, no cycle between any two packages or modules at any
depth, the providers independent of each other, shared code on the provider seam only. Here: that those
contracts hold and see every import a reader sees, that they are the picture docs/architecture.md draws, and
what import-linter cannot express (no file over 500 lines)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 500


def _contracts() -> dict[str, dict]:  # type: ignore[type-arg]
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in cfg["contracts"]}


def test_the_contracts_are_kept() -> None:
    from importlinter.cli import lint_imports

    assert lint_imports(config_filename=str(ROOT / "pyproject.toml")) == 0


def test_the_contracts_see_function_level_and_typing_only_imports() -> None:
    g = grimp.build_graph("gtrain", cache_dir=None)
    assert g.direct_import_exists(importer="gtrain.sync.objstore", imported="gtrain.sync.s3")  # inside a function
    assert g.direct_import_exists(importer="gtrain.runs.ship", imported="gtrain.context")  # under TYPE_CHECKING
    # and a cycle there would break the acyclic contract: grimp finds the one a test graph has
    t = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        t.add_module(m)
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a")):
        t.add_import(importer=a, imported=b)
    assert t.nominate_cycle_breakers("p")


def test_every_package_and_module_of_gtrain_is_in_one_layer() -> None:
    layers = _contracts()["layers"]["layers"]
    named = {n.strip() for layer in layers for n in re.split(r"[|:]", layer)}
    here = {p.stem if p.is_file() else p.name for p in (ROOT / "gtrain").iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert named == here


def test_the_picture_in_docs_is_the_contract() -> None:
    """docs/architecture.md draws the layers (top to bottom, one line each, siblings with `|`) between its
    ``<!-- layers -->`` markers; the contract lists the same, in the same order."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    block = doc.split("<!-- layers -->")[1]
    drawn = [m.group(1).strip() for m in re.finditer(r"^gtrain/(\S.*?)\s{2,}", block, re.M)]
    drawn = [re.sub(r"\s*\|\s*gtrain/", " | ", d).replace("/", "").replace(".py", "") for d in drawn]
    assert drawn == [re.sub(r"\s+", " ", layer) for layer in _contracts()["layers"]["layers"]]


def test_no_file_over_500_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "gtrain").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
