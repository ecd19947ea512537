"""docs/spec.md's field tables are generated from the models: the page may not drift from gtrain/spec/__init__.py."""

from __future__ import annotations

from gtrain.spec import ClusterSpec, Job
from gtrain.spec import doc as specdoc


def test_docs_spec_md_is_up_to_date_with_the_models() -> None:
    text = specdoc.DOC.read_text(encoding="utf-8")
    assert specdoc.render(text) == text, "docs/spec.md is out of date: run python -m gtrain.spec.doc"
    assert specdoc.main(["--check"]) == 0


def test_every_field_of_every_model_is_in_the_page() -> None:
    text = specdoc.DOC.read_text(encoding="utf-8")
    for model in specdoc.TABLES.values():
        for name, field in model.model_fields.items():
            if not field.exclude:  # base_dir, min_nodes (written num_nodes: {min, max})
                assert f"| `{name}` |" in text, f"{model.__name__}.{name} missing from docs/spec.md"
    assert "### job.data" in text and "| `src` |" in text and "| `data` | list of mappings |" in text


def test_a_changed_model_makes_the_check_fail() -> None:
    text = specdoc.DOC.read_text(encoding="utf-8")
    f = Job.model_fields["max_restarts"]
    old = f.description
    f.description = "something else"
    try:
        assert specdoc.render(text) != text
    finally:
        f.description = old
    assert "provider (only that one)" in specdoc.table(ClusterSpec)


def test_the_spec_page_names_every_registered_provider() -> None:
    """The example's `provider:` comment and the "provider." paragraph list what gtrain/registry.py registers
    (a stale list told users kubernetes, azure, lambda and ray did not exist)."""
    from gtrain.registry import REGISTRY

    text = specdoc.DOC.read_text(encoding="utf-8")
    comment = next(line for line in text.splitlines() if line.startswith("provider: local"))
    para = text.split("**provider.**", 1)[1].split("\n\n", 1)[0]
    for name in REGISTRY:
        assert name in comment.split("#", 1)[1], (name, comment)
        assert f"`{name}`" in para, name

