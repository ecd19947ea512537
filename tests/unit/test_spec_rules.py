"""Spec rules a new user trips over: numbers that are not numbers, policies without bound, secrets that
shadow gtrain's or the machine's variables, provider sections from the registry, GTRAIN_HOME that is a file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gtrain.errors import ConfigError
from gtrain.providers import register, unregister
from gtrain.registry import REGISTRY
from gtrain.spec import load_spec, parse_spec


def refused(data: dict[str, object]) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        parse_spec({"name": "demo", **data})
    assert ei.value.exit_code == 2 and "\n" not in ei.value.message
    return ei.value


@pytest.mark.parametrize("field", ["max_hours", "idle_minutes", "max_cost_usd"])
@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan", "1e300", "1.0e+300", "true"])
def test_policies_are_finite_and_bounded(tmp_path: Path, field: str, text: str) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(f"name: demo\npolicies:\n  {field}: {text}\n")
    with pytest.raises(ConfigError) as ei:
        load_spec(p)
    assert ei.value.field == f"policies.{field}"


def test_policy_bounds_and_ordinary_values() -> None:
    assert "less than or equal to 8760" in refused({"policies": {"max_hours": 8761}}).message
    assert "less than or equal to 525600" in refused({"policies": {"idle_minutes": 525601}}).message
    assert "less than or equal to 10000000" in refused({"policies": {"max_cost_usd": 1e7 + 1}}).message
    s = parse_spec({"name": "demo", "policies": {"max_hours": 8760, "idle_minutes": 0.5, "max_cost_usd": "1e3"}})
    assert (s.policies.max_hours, s.policies.idle_minutes, s.policies.max_cost_usd) == (8760, 0.5, 1000)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"num_nodes": True}, "num_nodes"),
        ({"num_nodes": False}, "num_nodes"),
        ({"resources": {"disk_gb": True}}, "resources.disk_gb"),
        ({"job": {"run": "t.py", "nproc_per_node": True}}, "job.nproc_per_node"),
        ({"job": {"run": "t.py", "max_restarts": True}}, "job.max_restarts"),
        ({"policies": {"max_hours": True}}, "policies.max_hours"),
    ],
)
def test_a_boolean_is_not_a_number(data: dict[str, object], field: str) -> None:
    e = refused(data)
    assert e.field == field and "is a boolean, not a number" in e.message


@pytest.mark.parametrize("name", ["RANK", "WORLD_SIZE", "MASTER_ADDR", "GTRAIN_NODE_RANK", "GTRAIN_ANYTHING"])
def test_secret_named_like_a_reserved_variable_is_refused_like_env(name: str) -> None:
    e = refused({"job": {"run": "t.py", "secrets": [name]}})
    assert e.field == "job.secrets" and "set by gtrain/torchrun" in e.message


@pytest.mark.parametrize("name", ["PATH", "HOME", "LD_LIBRARY_PATH", "PYTHONPATH"])
def test_secret_naming_a_variable_of_this_machine_is_refused(name: str) -> None:
    e = refused({"job": {"run": "t.py", "secrets": [name]}})
    assert e.field == "job.secrets" and f"this machine's {name}" in e.message


def test_secret_also_in_env_or_given_twice_is_refused() -> None:
    e = refused({"job": {"run": "t.py", "env": {"TOKEN": "x"}, "secrets": ["TOKEN"]}})
    assert e.field == "job" and "both set ['TOKEN']" in e.message
    assert "given more than once" in refused({"job": {"run": "t.py", "secrets": ["A", "A"]}}).message


def test_provider_sections_come_from_the_registry() -> None:
    # a built-in provider parses with its section
    s = parse_spec({"name": "demo", "provider": "slurm", "slurm": {"partition": "gpu"}})
    assert s.slurm == {"partition": "gpu"} and s.section("slurm") == {"partition": "gpu"}
    # a provider registered at run time gets its section without any change to the spec module
    register("acme", "gtrain.providers.local:LocalProvider")
    try:
        s = parse_spec({"name": "demo", "provider": "acme", "acme": {"zone": "z1"}})
        assert s.section("acme") == {"zone": "z1"} and s.ssh is None
        again = parse_spec(s.to_yaml_dict())
        assert again.section("acme") == {"zone": "z1"} and again.to_yaml_dict() == s.to_yaml_dict()
        assert "section 'acme:' is given but provider is 'local'" in refused({"acme": {}}).message
    finally:
        unregister("acme")
    e = refused({"provider": "acme"})
    names = sorted(REGISTRY)
    listed = ", ".join(repr(n) for n in names[:-1]) + f" or {names[-1]!r}"
    assert e.field == "provider" and f"'acme' is not one of {listed}" in e.message and "kubernetes" in listed
    e = refused({"acme": {}})
    assert e.field == "acme" and "unknown field" in e.message


def test_provider_section_round_trips_and_is_read_by_attribute() -> None:
    s = parse_spec({"name": "demo", "provider": "ssh", "ssh": {"hosts": ["a", "b:2222"], "user": "u"}})
    assert s.ssh == {"hosts": ["a", "b:2222"], "user": "u"} and s.aws is None and s.gcp is None
    d = s.to_yaml_dict()
    assert d["ssh"] == {"hosts": ["a", "b:2222"], "user": "u"} and "sections" not in d
    assert parse_spec(d) == s
    assert "did you mean 'ssh'" in refused({"sshh": {}}).message
    assert "unknown field" in refused({"sections": {"ssh": {}}}).message
    assert "section 'ssh:' must be a mapping of fields, got list" in refused({"provider": "ssh", "ssh": [1]}).message


def test_a_huge_value_in_an_error_is_shown_short_and_at_once() -> None:
    value: list[object] = ["lol"] * 9
    for _ in range(8):
        value = [value] * 9  # 9**9 leaves, shared
    t = time.perf_counter()
    e = refused({"name": value})
    assert time.perf_counter() - t < 1 and len(e.message) < 200


def test_gtrain_home_that_is_a_file_is_exit_2_naming_it(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("")
    for home, why in ((f, "it is a file"), (f / "sub", "a path above it is a file")):
        r = subprocess.run([sys.executable, "-m", "gtrain", "status", "--json"], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "GTRAIN_HOME": str(home)},
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 2, r.stderr
        assert f"GTRAIN_HOME '{home}' is not a directory: {why}" in r.stderr and "bug in gtrain" not in r.stderr
        assert '"field": "GTRAIN_HOME"' in r.stdout


@pytest.mark.parametrize("root", ["/", "//", "~", "~/", "~bob", "../..", "~/gtrain/../..", "/srv/x/../..", ""])
def test_ssh_root_that_down_would_wipe_is_refused(root: str) -> None:
    from gtrain.providers.ssh import parse_section

    spec = parse_spec({"name": "demo", "provider": "ssh", "ssh": {"hosts": ["a"], "root": root}})
    with pytest.raises(ConfigError) as ei:
        parse_section(spec)
    assert ei.value.exit_code == 2 and ei.value.field == "ssh.root" and repr(root) in ei.value.message
    assert parse_section(parse_spec({"name": "demo", "provider": "ssh",
                                     "ssh": {"hosts": ["a"], "root": "~/gtrain/demo"}})).root == "~/gtrain/demo"
