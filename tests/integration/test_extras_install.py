"""Each extra installed into a clean venv (not the test environment, whose own packages mask what an extra
forgets) runs the command it exists for. ``pip install 'gtrain[gcp]'`` once lacked ``packaging`` (google-auth's
urllib3 transport needs it) and ``gtrain sync`` then spun at 100 % CPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    return next(out.glob("gtrain_cli-*.whl"))


def _venv(tmp_path: Path, wheel: Path, extra: str, *, preinstalled: tuple[str, ...] = ()) -> Path:
    """A clean venv with ``gtrain-cli[extra]`` (the wheel; its dependencies from the index). ``preinstalled``:
    distributions hard-linked from the test environment first (their files only, never its site-packages on the
    path), for one the index would bring at a size no test can afford (torch: PyPI's build pulls ~2.5 GiB of
    CUDA wheels)."""
    v = tmp_path / f"venv-{extra}"
    if v.exists():
        return v
    import tomllib
    import zipfile

    with zipfile.ZipFile(wheel) as z:  # the extra is declared (pip only warns about a missing one)
        meta = next(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    assert f"Provides-Extra: {extra}" in meta.splitlines(), f"the wheel declares no extra {extra!r}"
    reqs = sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra])
    same = next((o for o in tmp_path.glob("venv-*") if (o / "reqs").is_file() and not preinstalled
                 and (o / "reqs").read_text() == repr(reqs)), None)
    if same is not None:  # an extra with the very same requirements (lambda, runpod, vast): the same install
        return same
    # no pip inside (ensurepip costs seconds): the test environment's pip installs into it (--python), with
    # no .pyc compiled ahead (most of pip's CPU time for botocore & co.; imports compile what they need)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(v)], check=True, timeout=120)
    for name in preinstalled:
        _link_distribution(name, v)
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(v / "bin" / "python"), "install", "-q",
                        "--disable-pip-version-check", "--no-compile", f"{wheel}[{extra}]"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    if not preinstalled:
        (v / "reqs").write_text(repr(reqs))
    return v


def _link_distribution(name: str, venv: Path) -> None:
    import importlib.metadata
    import sysconfig

    dist = importlib.metadata.distribution(name)
    dest = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    for f in dist.files or ():
        if f.parts[0] == "..":  # console scripts: not needed
            continue
        src = Path(str(dist.locate_file(f)))
        if not src.is_file():
            continue
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dest / f)
        except OSError:  # another file system
            shutil.copy2(src, dest / f)


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Any:
    """One venv per extra for the module (the provider test and the sync test of an extra share it)."""
    root = tmp_path_factory.mktemp("venvs")
    return lambda extra, **kw: _venv(root, wheel, extra, **kw)


def _gtrain(v: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(v / "bin" / "gtrain"), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NO_COLOR": "1", **env}, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_gcp_extra_syncs_to_a_bucket(tmp_path: Path, wheel: Path, gcs_emulator: str) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    storage.Client(project="gtrain-test", credentials=AnonymousCredentials()).create_bucket("gt-extras-gcp")
    v = _venv(tmp_path, wheel, "gcp")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello")
    r = _gtrain(v, "sync", str(src), "gs://gt-extras-gcp/x", env={"STORAGE_EMULATOR_HOST": gcs_emulator})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "this is a bug" not in r.stderr


@pytest.mark.slow
def test_aws_extra_syncs_to_a_bucket(tmp_path: Path, wheel: Path, seaweedfs, weed_bucket: str) -> None:  # type: ignore[no-untyped-def]
    v = _venv(tmp_path, wheel, "aws")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello")
    r = _gtrain(v, "sync", str(src), f"s3://{weed_bucket}/x", env=seaweedfs.env())
    assert r.returncode == 0, r.stdout + r.stderr
    # the extra brings the compiled engine, and it is the one that moved the bytes (gtrain/sync/s3fast.py)
    probe = ("from gtrain.sync.objstore import make_backend, parse_location; "
             f"print(type(make_backend(parse_location('s3://{weed_bucket}/x', 'DST'), fld='DST')).__name__)")
    r = subprocess.run([str(v / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **seaweedfs.env()})
    assert r.stdout.strip() == "ObstoreS3Backend", r.stdout + r.stderr


#: provider extra -> (its spec, one more command that reaches the extra's own packages, or None)
PROVIDER_EXTRAS = {
    "lambda": ("name: lam\nprovider: lambda\nnum_nodes: 2\nresources: {accelerators: 'A10:1'}\n", None),
    "azure": ("name: az\nprovider: azure\nnum_nodes: 2\nresources: {accelerators: 'A100:8', region: eastus}\n",
              ("gc", "--provider", "azure")),  # no login here: azure-identity's credential chain runs and fails
    "kubernetes": ("name: k8\nprovider: kubernetes\nnum_nodes: 2\nresources: {accelerators: 'H100:8'}\n"
                   "job: {image: 'nvcr.io/nvidia/pytorch:25.01-py3', run: train.py}\n", None),
    "ray": ("name: rr\nprovider: ray\nnum_nodes: 2\nray: {address: 'http://127.0.0.1:9'}\n", None),
    # no key: each plans from its bundled, dated prices (marked OFFLINE), as an any_of does
    "runpod": ("name: rp\nprovider: runpod\nresources: {accelerators: 'H100:8'}\n", ("gc", "--provider", "runpod")),
    "vast": ("name: va\nprovider: vast\nresources: {accelerators: 'RTX4090:1'}\n", ("gc", "--provider", "vast")),
    # no credentials here: the SDK's modules load (compute, the config reader), then "no Nebius credentials found"
    "nebius": ("name: nb\nprovider: nebius\nnum_nodes: 2\nresources: {accelerators: 'H100:8'}\n"
               "nebius: {project_id: project-e00abc, subnet_id: vpcsubnet-e00abc}\n",
               ("gc", "--provider", "nebius", "--region", "project-e00abc")),
}


@pytest.mark.slow
@pytest.mark.parametrize("extra", sorted(PROVIDER_EXTRAS))
def test_provider_extra_alone_plans_offline(tmp_path: Path, venvs: Any, extra: str) -> None:
    spec_text, more = PROVIDER_EXTRAS[extra]
    v = venvs(extra)
    (tmp_path / "spec.yaml").write_text(spec_text)
    (tmp_path / "train.py").write_text("print(1)\n")
    env = {"GTRAIN_HOME": str(tmp_path / "home"), "LAMBDA_API_KEY": "", "LAMBDA_API_URL": "http://127.0.0.1:9",
           "AZURE_SUBSCRIPTION_ID": "00000000-0000-0000-0000-000000000000", "KUBECONFIG": str(tmp_path / "none"),
           "NEBIUS_IAM_TOKEN": "", "RUNPOD_API_KEY": "", "VAST_API_KEY": "",
           "HOME": str(tmp_path / "home")}
    r = _gtrain(v, "up", "--dry-run", str(tmp_path / "spec.yaml"), env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert extra in r.stdout and "this is a bug" not in r.stderr
    if more is not None:
        r = _gtrain(v, *more, env=env)
        assert r.returncode in (1, 2) and r.stderr.startswith("Error: ") and "Traceback" not in r.stderr, r.stderr
        assert "not installed" not in r.stderr and "pip install" not in r.stderr, r.stderr  # the extra is complete


def _probe_backend(v: Path, url: str, env: dict[str, str]) -> str:
    probe = ("from gtrain.sync.objstore import make_backend, parse_location; "
             f"print(type(make_backend(parse_location({url!r}, 'DST'), fld='DST')).__name__)")
    r = subprocess.run([str(v / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **env})
    return r.stdout.strip() or r.stderr[-500:]


@pytest.mark.slow
def test_azure_extra_syncs_to_a_container(tmp_path: Path, venvs: Any, azurite: Any) -> None:
    """``gtrain[azure]`` alone (the venv test_provider_extra_alone_plans_offline[azure] built): a sync to
    Azurite, on the compiled engine the extra brings."""
    from gtrain.sync.azwire import AzureWire, resolve_account

    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    wire = AzureWire(resolve_account(env))
    wire.request("PUT", "gt-extras-az", query={"restype": "container"}, ok=(201, 409))
    wire.close()
    v = venvs("azure")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello")
    r = _gtrain(v, "sync", str(src), "az://gt-extras-az/x", env={**env, "GTRAIN_HOME": str(tmp_path / "home")})
    assert r.returncode == 0 and "this is a bug" not in r.stderr, r.stdout + r.stderr
    assert _probe_backend(v, "az://gt-extras-az/x", env) == "ObstoreAzureBackend"


@pytest.mark.slow
def test_ssh_extra_execs_on_a_host(tmp_path: Path, venvs: Any, ssh_hosts: Any) -> None:
    """``gtrain[ssh]`` alone: up, exec and down on one real sshd host."""
    import json

    h = ssh_hosts[0]
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"name": "xssh", "provider": "ssh", "num_nodes": 1, "ssh": {
        "user": h.user, "identity_file": h.identity_file, "python": sys.executable, "hosts": [f"{h.address}:{h.port}"],
        "host_keys": {f"{h.address}:{h.port}": h.host_key_line}}}))
    v = venvs("ssh")
    env = {"GTRAIN_HOME": str(tmp_path / "home")}
    try:
        r = _gtrain(v, "up", str(spec), env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        r = _gtrain(v, "exec", "xssh", "--", "echo from-$(hostname)", env=env)
        assert r.returncode == 0 and f"from-{h.name}" in r.stdout, r.stdout + r.stderr
    finally:
        r = _gtrain(v, "down", "xssh", env=env)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_all_extra_syncs_to_a_bucket(tmp_path: Path, venvs: Any, seaweedfs, weed_bucket: str) -> None:  # type: ignore[no-untyped-def]
    """``gtrain[all]``: every extra resolves together from the index (torch hard-linked in first: see _venv)
    and a sync runs on it."""
    v = venvs("all", preinstalled=("torch",))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello")
    r = _gtrain(v, "sync", str(src), f"s3://{weed_bucket}/all", env={**seaweedfs.env(),
                                                                     "GTRAIN_HOME": str(tmp_path / "home")})
    assert r.returncode == 0 and "this is a bug" not in r.stderr, r.stdout + r.stderr
    r = subprocess.run([str(v / "bin" / "python"), "-c", "import torch, obstore, paramiko, google.auth, lightkube"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-1000:]
