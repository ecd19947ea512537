from __future__ import annotations

from pathlib import Path

import pytest

from gtrain.errors import ConfigError
from gtrain.spec import load_spec, parse_spec


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    return p


def test_minimal_cluster_spec() -> None:
    s = parse_spec({"name": "demo", "provider": "local", "num_nodes": 2})
    assert (s.name, s.provider, s.num_nodes, s.job) == ("demo", "local", 2, None)


def test_full_spec_and_workdir_relative_to_spec_file(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    p = write(tmp_path, """
name: demo
num_nodes: 2
resources: {accelerators: a100:8, disk_gb: 200}
job:
  workdir: proj
  setup: pip install -r requirements.txt
  run: train.py --steps 50
  nproc_per_node: 2
  env: {LR: 0.01, DEBUG: true, WEIRD: "\\"; rm -rf ~ #"}
  secrets: [HF_TOKEN]
  checkpoint_dir: ckpt/run1
policies: {idle_minutes: 30, max_hours: 24, max_cost_usd: 200}
""")
    s = load_spec(p)
    assert s.provider == "local"
    assert s.resources.accelerators == "A100:8" and s.resources.gpus_per_node == 8
    assert s.job is not None
    assert s.job.env == {"LR": "0.01", "DEBUG": "true", "WEIRD": '"; rm -rf ~ #'}
    assert s.job.argv == ["train.py", "--steps", "50"]
    assert s.workdir_path() == (tmp_path / "proj").resolve()
    assert s.policies.max_cost_usd == 200


def test_name_override(tmp_path: Path) -> None:
    assert load_spec(write(tmp_path, "name: a\n"), name="other").name == "other"


@pytest.mark.parametrize(
    ("text", "field", "fragment"),
    [
        ("name: demo\nnum_nodes: 0\n", "num_nodes", "greater than or equal to 1"),
        ("name: demo\nnum_nodes: 10000\n", "num_nodes", "less than or equal to 4096"),
        ("name: demo\nnum_nodes: two\n", "num_nodes", "'two'"),
        ("name: Demo_1\n", "name", "a-z, 0-9"),
        ("name: demo\nnum_nodse: 2\n", "num_nodse", "did you mean 'num_nodes'"),
        ("name: demo\njob: {run: t.py, enf: {}}\n", "job.enf", "did you mean 'env'"),
        ("name: demo\nprovider: oracle\n", "provider", "'oracle' is not one of"),
        ("name: demo\njob: {run: t.py, checkpoint_dir: /abs}\n", "job.checkpoint_dir", "relative"),
        ("name: demo\njob: {run: t.py, env: {RANK: '1'}}\n", "job.env", "set by gtrain"),
        ("name: demo\njob: {run: t.py, env: {'BAD-NAME': x}}\n", "job.env", "not a valid environment variable"),
        ("name: demo\nresources: {accelerators: 'A100:x'}\n", "resources.accelerators", "GPU:COUNT"),
        ("name: demo\njob: {nproc_per_node: 2}\n", "job.run", "required field is missing"),
        ("num_nodes: 2\n", "name", "required field is missing"),
    ],
)
def test_bad_input_names_field_value_and_fix(tmp_path: Path, text: str, field: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load_spec(write(tmp_path, text))
    e = ei.value
    assert e.exit_code == 2
    assert e.field == field
    assert field in e.message and fragment in e.message
    assert "\n" not in e.message


def test_malformed_yaml_names_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load_spec(write(tmp_path, "name: demo\njob:\n  run: [unclosed\n"))
    assert "malformed YAML at line" in ei.value.message


def test_not_a_mapping_and_empty(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_spec(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="is empty"):
        load_spec(write(tmp_path, ""))


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_spec("/nonexistent/spec.yaml")


def test_provider_section_must_match_provider() -> None:
    with pytest.raises(ConfigError, match="section 'aws:' is given but provider is 'local'"):
        parse_spec({"name": "x", "aws": {"profile": "p"}})
