"""Every ```yaml block of the docs (docs/*.md and README.md) loads with the spec loader and validates as a
spec: a fragment without ``name:`` is validated with ``name: docs-example`` added. A block that is a
reference rather than one spec (options of several launchers at once) is preceded by the line
``<!-- yaml: reference -->`` and must still load."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gtrain.spec import parse_spec
from gtrain.spec.loader import load

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- yaml: reference -->"


def blocks() -> list[tuple[str, str, bool]]:
    found = []
    for page in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"^```yaml\n(.*?)^```", text, re.S | re.M):
            line = text.count("\n", 0, m.start()) + 1
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            found.append((f"{page.relative_to(ROOT)}:{line}", m.group(1), before.strip() == MARK))
    return found


def test_the_docs_have_yaml_examples() -> None:
    where = {b[0].split(":")[0] for b in blocks()}
    assert {"docs/durable.md", "docs/spec.md", "docs/launchers.md", "README.md"} <= where


@pytest.mark.parametrize(("where", "text", "reference"), blocks(), ids=[b[0] for b in blocks()])
def test_every_yaml_example_in_the_docs_loads_and_validates(where: str, text: str, reference: bool) -> None:
    data = load(text, where)
    assert isinstance(data, dict), f"{where}: not a mapping"
    if not reference:
        parse_spec({"name": "docs-example", **data}, base_dir=str(ROOT), source=where)


def test_the_documented_recovery_policy_keeps_its_on_key() -> None:
    data = load("policies:\n  recovery: {max_restarts: 10, on: [preemption, node_failure]}\n  x: yes\n", "t")
    assert data == {"policies": {"recovery": {"max_restarts": 10, "on": ["preemption", "node_failure"]},
                                 "x": True}}
    data["policies"].pop("x")
    assert parse_spec({"name": "d", **data}).policies.recovery is not None
