"""Launch templates: golden files, and every user value reaching bash byte for byte without running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gtrain.jobs.render import NodeContext, render_all

GOLDEN = Path(__file__).parent / "golden"
EVIL = {
    "INJECT": '"; rm -rf ~ #',
    "DOLLAR": "$HOME $(touch /tmp/gtrain-pwned) `id`",
    "QUOTES": "it's \"quoted\" \\ back",
    "SPACES": "  a  b  ",
    "NEWLINE": "line1\nline2; echo pwned",
}


def ctx(**over: object) -> NodeContext:
    base = dict(
        job_id="demo-20260101-000000-abcd", cluster="demo", node_rank=1, num_nodes=2,
        node_ips=["10.0.0.5", "10.0.0.6"], node_addr="10.0.0.6", master_addr="10.0.0.5", master_port=29500,
        nproc_per_node=2, job_dir="/home/u/gtrain/demo/jobs/demo-20260101-000000-abcd",
        workdir="/home/u/gtrain/demo/workdir", checkpoint_dir="/home/u/gtrain/demo/workdir/checkpoints",
        python="python3", argv=["train.py", "--steps", "50", "--name", "a b;c"], env={"LR": "0.01"},
        secret_names=["HF_TOKEN"], setup="pip install -r requirements.txt", max_restarts=0,
    )
    base.update(over)
    return NodeContext(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["launch.sh", "rank.sh", "setup.sh"])
def test_golden(name: str) -> None:
    got = render_all(ctx())[name]
    golden = GOLDEN / name
    if os.environ.get("GTRAIN_UPDATE_GOLDEN") == "1":
        golden.write_text(got)
    assert got == golden.read_text(), f"{name} changed; GTRAIN_UPDATE_GOLDEN=1 rewrites the golden files"


def test_torchrun_flags_node0_hosts_the_store() -> None:
    s0 = render_all(ctx(node_rank=0, node_addr="10.0.0.5"))["launch.sh"]
    s1 = render_all(ctx())["launch.sh"]
    for flag in ("--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=static", "--rdzv_endpoint=10.0.0.5:29500",
                 "--rdzv_id=demo-20260101-000000-abcd", "--max_restarts=0"):
        assert flag in s0 and flag in s1
    assert "--node_rank=0" in s0 and "--node_rank=1" in s1  # static rendezvous: group rank = node rank
    assert "--local_addr=10.0.0.5" in s0 and "--local_addr=10.0.0.6" in s1


def test_every_value_arrives_byte_for_byte_and_runs_nothing(tmp_path: Path) -> None:
    """Run the rendered setup script's prelude for real: env values come out exactly, secrets come from
    stdin, and no injected command runs."""
    marker = Path("/tmp/gtrain-pwned")
    marker.unlink(missing_ok=True)
    work = tmp_path / "work dir; $(x)"
    work.mkdir()
    c = ctx(workdir=str(work), checkpoint_dir=str(work / "ck pt"), env=EVIL, secret_names=["TOKEN"],
            job_dir=str(tmp_path / "job"), python=sys.executable,
            setup='python3 -c "import os,json,hashlib,base64; t=os.environ[\'TOKEN\'].encode(); '
                  'print(json.dumps({k: os.environ.get(k) for k in '
                  + repr(sorted([*EVIL, "TOKEN", "GTRAIN_NODE_IPS", "GTRAIN_CHECKPOINT_DIR"])) + '})); '
                  'print(hashlib.sha256(t).hexdigest()); print(t.hex(), base64.b64encode(t).decode())"')
    files = render_all(c)
    script = files["setup.sh"]
    assert "s3cr3t" not in script
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "mask.py").write_text(files["mask.py"])
    p = subprocess.run(["bash", "-c", script], input=b"TOKEN=s3cr3t value;$x\x00OTHER=nope\x00",
                       capture_output=True, timeout=30)
    assert p.returncode == 0, p.stderr
    import base64
    import hashlib
    import json

    lines = p.stdout.decode().strip().splitlines()
    got = json.loads(lines[-3])
    assert {k: got[k] for k in EVIL} == EVIL
    secret = b"s3cr3t value;$x"
    assert lines[-2] == hashlib.sha256(secret).hexdigest()  # the value arrived byte for byte ...
    assert got["TOKEN"] == "***" and lines[-1] == "*** ***"  # ... and setup's output has it masked (issue 40)
    for form in (secret, secret.hex().encode(), base64.b64encode(secret).rstrip(b"=")):
        assert form not in p.stdout + p.stderr
    assert got["GTRAIN_NODE_IPS"] == "10.0.0.5,10.0.0.6"
    assert got["GTRAIN_CHECKPOINT_DIR"] == str(work / "ck pt")
    assert not marker.exists()
    assert (work / "ck pt").is_dir()


def test_secret_values_never_rendered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf-s3cr3t-value")
    files = render_all(ctx(secret_names=["HF_TOKEN", "WANDB_API_KEY"]))
    for text in files.values():
        assert "hf-s3cr3t-value" not in text
    # names only: the case of _env.sh, and the masking filter's `env -u` and fd-3 records (gtrain.remote.nodemask)
    assert "HF_TOKEN|WANDB_API_KEY)" in files["launch.sh"]
    assert "env -u HF_TOKEN -u WANDB_API_KEY" in files["rank.sh"] and "mask.py" in files
    assert "mask.py" not in render_all(ctx(secret_names=[]))


def test_data_script_golden_and_quoted() -> None:
    from gtrain.jobs.data import DATA_MAIN, bundle, entries_json
    from gtrain.jobs.render import render
    from gtrain.spec import DataEntry

    entries = [DataEntry(src="s3://bucket/ds", dst="data/a b")]
    got = render("data.sh", ctx(), bundle="/home/u/gtrain/demo/gtrain-sync.pyz", data_main=DATA_MAIN,
                 data_json=entries_json(entries, "/home/u/gtrain/demo/workdir"))
    golden = GOLDEN / "data.sh"
    if os.environ.get("GTRAIN_UPDATE_GOLDEN") == "1":
        golden.write_text(got)
    assert got == golden.read_text()
    import zipfile
    from io import BytesIO

    names = zipfile.ZipFile(BytesIO(bundle())).namelist()
    assert "gtrain/sync/objstore.py" in names and "gtrain/cli/app.py" not in names
    assert bundle() == bundle()


@pytest.mark.parametrize("bad", [{"src": "http://x/y", "dst": "d"}, {"src": "s3://b/p", "dst": "../x"},
                                 {"src": "s3://b/p", "dst": "/abs"}])
def test_data_entry_validation(bad: dict) -> None:  # type: ignore[type-arg]
    from gtrain.errors import ConfigError
    from gtrain.spec import parse_spec

    with pytest.raises(ConfigError, match=r"job\.data\[0\]\.(src|dst)"):
        parse_spec({"name": "x", "job": {"run": "t.py", "data": [bad]}})


def test_the_sync_bundle_is_self_contained(tmp_path: Path) -> None:
    """A node imports the sync engine and both backends from the bundle alone: every gtrain module they import
    must be in it (``python -S``: no site-packages, so not this checkout's editable install either)."""
    import subprocess
    import sys

    from gtrain.jobs.data import bundle

    pyz = tmp_path / "gtrain-sync.pyz"
    pyz.write_bytes(bundle())
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "import gtrain.sync.objstore, gtrain.sync.s3, gtrain.sync.s3wire, gtrain.sync.gcs, gtrain.sync.gcswire; "
            "print(gtrain.sync.objstore.__file__)")
    p = subprocess.run([sys.executable, "-S", "-c", code, str(pyz)], capture_output=True, text=True, cwd=tmp_path,
                       env={"PATH": os.environ.get("PATH", "")}, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().startswith(str(pyz)), p.stdout
