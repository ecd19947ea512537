"""The spec's ``volumes:`` (gtrain/spec/volumes.py): each refusal is one line naming the field, the value and the
fix (exit 2), on the command line too; a spec without volumes keeps its shape; the cost report's standing charge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gtrain.costs.report import CostReport, standing_charges, volume_charges
from gtrain.errors import ConfigError
from gtrain.spec import parse_spec
from gtrain.spec.volumes import VolumeInfo, path_refusal, path_script, root_refusal


def spec(vols: Any, provider: str = "local", **extra: Any) -> Any:
    return parse_spec({"name": "v", "provider": provider, "volumes": vols, **extra})


@pytest.mark.parametrize(("vols", "provider", "field", "words"), [
    ([{"name": "d", "mount": "data"}], "local", "volumes[0].mount", "must be an absolute path"),
    ([{"name": "d", "mount": "/"}], "local", "volumes[0].mount", "system's /"),
    ([{"name": "d", "mount": "/etc/x"}], "local", "volumes[0].mount", "inside the system's /etc"),
    ([{"name": "d", "mount": "/home/ubuntu"}], "local", "volumes[0].mount", "gtrain's node folders"),
    ([{"name": "d", "mount": "/home"}], "local", "volumes[0].mount", "gtrain's node folders"),
    ([{"name": "d", "mount": "/tmp"}], "local", "volumes[0].mount", "folder of the system"),
    ([{"name": "d", "mount": "/srv/gtrain/x"}], "local", "volumes[0].mount", "gtrain keeps its own files"),
    ([{"name": "d", "mount": "/data/../etc"}], "local", "volumes[0].mount", "'..'"),
    ([{"name": "d", "mount": "/d", "size_gb": 0}], "local", "volumes[0].size_gb", "greater than or equal to 1"),
    ([{"name": "d", "mount": "/d", "size_gb": True}], "local", "volumes[0].size_gb", "boolean"),
    ([{"name": "D", "mount": "/d"}], "local", "volumes[0].name", "a-z"),
    ([{"name": "d", "mount": "/d"}, {"name": "d", "mount": "/e"}], "local", "volumes[1].name", "also volumes[0]"),
    ([{"name": "d", "mount": "/d"}, {"name": "e", "mount": "/d/"}], "local", "volumes[1].mount", "also volumes[0]"),
    ([{"name": "d", "mount": "/d/x"}, {"name": "e", "mount": "/d"}], "local", "volumes[1].mount", "lies inside"),
    ([{"name": "d", "mount": "/d", "type": "gp3"}], "local", "volumes[0].type", "not a volume type of local"),
    ([{"name": "d", "mount": "/d", "type": "gp9", "size_gb": 5}], "aws", "volumes[0].type", "not a volume type"),
    ([{"name": "d", "mount": "/d", "size_gb": 5}], "ray", "volumes", "keeps no volumes in gtrain yet"),
    ([{"name": "d", "mount": "/d", "path": "/x", "size_gb": 5}], "aws", "volumes[0].path", "only a `type: path`"),
    ([{"name": "d", "mount": "/d", "read_only": True}], "ssh", "volumes[0].read_only", "cannot make it read-only"),
    ([{"name": "d", "mount": "/d", "sz": 1}], "local", "volumes[0].sz", "unknown field"),
])
def test_refusals_name_the_field(vols: Any, provider: str, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as e:
        spec(vols, provider)
    assert e.value.field == field and e.value.exit_code == 2
    assert words in e.value.message and field in e.value.message, e.value.message


def test_accepted_and_normalised_and_shape_kept() -> None:
    s = spec([{"name": "data", "mount": "/data/", "type": "path", "path": "/scratch//ds"}])
    [v] = s.volumes
    assert (v.mount, v.host_path, v.env_name) == ("/data", "/scratch/ds", "GTRAIN_VOLUME_DATA")
    assert s.to_yaml_dict()["volumes"] == [{"name": "data", "mount": "/data", "type": "path", "path": "/scratch/ds",
                                           "read_only": False}]
    assert "volumes" not in parse_spec({"name": "v"}).to_yaml_dict()  # clusters made before: the same shape
    with pytest.raises(ConfigError, match="resources.any_of"):
        spec([{"name": "d", "mount": "/d"}], "local", resources={"any_of": [{"provider": "local"}]})


def test_aws_sizes_checked_at_plan() -> None:
    from gtrain.providers.aws.volumes import check_sizes, mount_script, rate

    with pytest.raises(ConfigError, match="required for an EBS volume") as e:
        check_sizes(spec([{"name": "d", "mount": "/d"}], "aws"))
    assert e.value.field == "volumes[0].size_gb"
    with pytest.raises(ConfigError, match="st1 volume is 125..16384 GB"):
        check_sizes(spec([{"name": "d", "mount": "/d", "size_gb": 10, "type": "st1"}], "aws"))
    assert rate("gp3", "us-east-1") == 0.08 and rate("gp3", "eu-west-1") == 0.088 and rate("sc1", None) == 0.015
    assert "mkfs.ext4" not in mount_script([{"id": "vol-1", "name": "d", "mount": "/d", "device": "/dev/sdf",
                                             "read_only": True}])


def test_path_script_and_refusals(tmp_path: Path) -> None:
    src = tmp_path / "src"
    s = spec([{"name": "d", "mount": str(tmp_path / "m" / "d"), "path": str(src)}])
    r = subprocess.run(["bash", "-c", path_script(s, link=False)], capture_output=True, text=True)
    err = path_refusal(s, "node 1 (h)", r.stdout)
    assert r.returncode == 3 and err is not None and err.field == "volumes[0].path"
    assert f"{src} does not exist on node 1 (h)" in err.message and "nothing was created" in (err.hint or "")
    assert not (tmp_path / "m").exists()  # the check makes nothing
    src.mkdir()
    for _ in range(2):  # linking is idempotent
        r = subprocess.run(["bash", "-c", path_script(s, link=True)], capture_output=True, text=True)
        assert r.returncode == 0 and path_refusal(s, "n", r.stdout) is None, r.stderr
    assert (tmp_path / "m" / "d").readlink() == src
    other = spec([{"name": "d", "mount": str(tmp_path / "m" / "d"), "path": str(tmp_path)}])
    r = subprocess.run(["bash", "-c", path_script(other, link=False)], capture_output=True, text=True)
    err = path_refusal(other, "node 0", r.stdout)
    assert err is not None and err.field == "volumes[0].mount" and "is not a link to" in err.message
    root = root_refusal(spec([{"name": "d", "mount": "/srv/x"}]), "/srv/x/home/gt", "node 0")
    assert root is not None and "overlaps gtrain's own folder" in root.message
    assert root_refusal(spec([{"name": "d", "mount": "/srv/x"}]), "/srv/y", "node 0") is None


def test_cost_report_standing_charge() -> None:
    from gtrain.state import Cluster

    c = Cluster(id="c-1", name="c", provider="aws", status="terminated", num_nodes=1, spec={}, region="us-east-1",
                instance_type=None, market=None, price_per_hour=0.0, created_at=0.0, terminated_at=1.0,
                extra={"volumes": [{"name": "d", "id": "vol-1", "type": "gp3", "region": "us-east-1", "size_gb": 50,
                                    "usd_per_gb_month": 0.08}]})
    [v] = volume_charges(c)
    assert v["usd_per_month"] == 4.0
    a, b = CostReport("a", "1", "aws", "terminated", volumes=[v]), CostReport("b", "2", "aws", "up", volumes=[v])
    assert a.standing_usd_per_month == 4.0 and a.to_dict()["volumes"] == [v]
    assert standing_charges([a, b]) == [{**v, "cluster": "b"}]  # one volume, counted once
    assert VolumeInfo("d", "aws", "gp3", 50, usd_per_gb_month=0.08).to_dict()["usd_per_month"] == 4.0


def test_cli_bad_volume_is_one_line_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(json.dumps({"name": "v", "volumes": [{"name": "d", "mount": "/etc/d"}], "job": {"run": "t.py"}}))
    r = subprocess.run([sys.executable, "-m", "gtrain", "up", str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "volumes[0].mount: '/etc/d'" in r.stderr and "/data" in r.stderr
    r = subprocess.run([sys.executable, "-m", "gtrain", "volume", "ls", "--provider", "local"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "keeps no volumes of its own" in r.stderr and "Traceback" not in r.stderr


def test_teardown_report_prints_the_standing_charge(capsys: pytest.CaptureFixture[str]) -> None:
    from gtrain.cli import output

    v = {"name": "d", "id": "vol-1", "type": "gp3", "region": "us-east-1", "size_gb": 50, "usd_per_gb_month": 0.08,
         "usd_per_month": 4.0}
    output.cost_table(CostReport("a", "1", "aws", "terminated", volumes=[v]))
    out = capsys.readouterr().out
    assert "volume d: 50 GB at $0.08/GB-month = $4.00/month standing charge, until `gtrain volume delete d`" in out
