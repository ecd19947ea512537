"""``resources.any_of`` through the CLI with a provider from a plug-in (tests/fake_provider.py, which has a quota
pre-check) and ``local``: a candidate whose quota cannot hold the request is skipped before anything is made,
and said so in `up`, `status` and `cost`; bad candidates are one clear message, exit 2, nothing made."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fake_provider import installed, tagged


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gtrain", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def write(tmp_path: Path, resources: dict[str, Any], **top: Any) -> str:
    f = tmp_path / "spec.yaml"
    f.write_text(json.dumps({"name": "anyof-cli", "num_nodes": 2, "resources": resources, **top}))
    return str(f)


def test_quota_precheck_skips_a_candidate_before_anything_is_made(tmp_path: Path) -> None:
    with installed(tmp_path / "cloud") as _site:
        (tmp_path / "cloud" / "quota").write_text("1")  # the fake account holds 1 instance; 2 are asked
        spec = write(tmp_path, {"any_of": [{"provider": "fake"}, {"provider": "local"}], "order": "listed"},
                     fake={})
        r = cli("up", spec, "--yes", "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        cands = out["placement"]["candidates"]
        assert [(c["provider"], c["outcome"]) for c in cands] == [("fake", "skipped"), ("local", "landed")]
        assert "instance quota 1, 2 asked" in cands[0]["why"] and "skipped before anything was made" in r.stderr
        assert tagged() == []  # nothing was made on the skipped candidate
        st = cli("status", "anyof-cli", "--json")
        assert st.returncode == 0, st.stderr
        status = json.loads(st.stdout)
        assert status["provider"] == "local" and status["placement"]["candidates"][0]["outcome"] == "skipped"
        txt = cli("status", "anyof-cli")
        assert "candidates (resources.any_of, order: listed)" in txt.stdout and "skipped" in txt.stdout
        d = cli("down", "anyof-cli", "--yes")
        assert d.returncode == 0, d.stderr
        assert "candidates (resources.any_of" in d.stdout and "landed" in d.stdout
        cost = cli("cost", "--json")
        assert cost.returncode == 0, cost.stderr
        assert "landed" in cost.stdout


@pytest.mark.parametrize(("resources", "top", "says"), [
    ({"any_of": [{"provider": "nope"}]}, {}, "resources.any_of[0].provider: 'nope' is not one of"),
    ({"any_of": [{"provider": "local", "regionz": ["x"]}]}, {}, "resources.any_of[0].regionz: unknown field"),
    ({"any_of": [{"region": "x"}]}, {}, "resources.any_of[0].provider: required field is missing"),
    ({"any_of": [{"provider": "local"}, {"provider": "ssh"}]}, {"provider": "local"},
     "resources.any_of[1].provider: 'ssh' disagrees with provider 'local'"),
    ({"any_of": []}, {}, "resources.any_of: [] — an empty list"),
    ({"order": "price"}, {}, "resources.order is given without resources.any_of"),
    ({"any_of": [{"provider": "local"}], "order": "cheapest"}, {}, "resources.order: 'cheapest' is not one of"),
    ({"any_of": [{"provider": "local"}]}, {"gcp": {}}, "section 'gcp:' is given but no resources.any_of candidate"),
])
def test_bad_any_of_is_one_message_exit_2(tmp_path: Path, resources: dict[str, Any], top: dict[str, Any],
                                         says: str) -> None:
    r = cli("up", write(tmp_path, resources, **top), "--dry-run")
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr


def test_launch_dry_run_before_up_renders_the_first_candidate(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    spec = write(tmp_path, {"any_of": [{"provider": "ssh"}, {"provider": "local"}]},
                 job={"workdir": str(work), "run": "train.py"})
    r = cli("launch", spec, "--dry-run", "--json")  # ssh has no hosts: it cannot be planned, local is chosen
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["plan"]["provider"] == "local"
