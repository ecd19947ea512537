"""provider: kubernetes at the CLI against tests/fixtures/fake_kube.py (issue 40): the hint of a command that
needs a pod is a command that works, `exec` exits as `ssh` does where no pod runs, `status --gpus` once the pods
are gone exits 0 as local does, gtrain's own `[gtrain] rank-exit` markers stay out of `logs`, and `down` while
a job runs keeps its lines for `gtrain logs`."""

from __future__ import annotations

import re
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.fixtures.fake_kube import FakeKube, FakeNode
from tests.integration.test_kubernetes import H100, cli, spec, wait_for


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    root = Path(tempfile.mkdtemp(prefix="gtrain-kube-"))
    k = FakeKube(root, nodes=[FakeNode(f"gpu-{i}", dict(H100), {"nvidia.com/gpu": "8"}) for i in range(2)]).start()
    try:
        yield k
    finally:
        k.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_hint_exec_status_gpus_rank_exit_and_logs_after_down(kube: FakeKube, tmp_path: Path) -> None:
    path = spec(tmp_path, "k8s-cli", "slurm_train.py --steps 2")
    assert cli(kube, tmp_path, "up", path).returncode == 0

    # no pod yet: ssh and exec fail alike (exit 1, not exec's 255), and the hint is a command that works
    ssh = cli(kube, tmp_path, "ssh", "k8s-cli", "--", "true")
    ex = cli(kube, tmp_path, "exec", "k8s-cli", "--", "true")
    assert ssh.returncode == 1 and "has no running pod" in ssh.stderr, ssh.stderr
    assert ex.returncode == ssh.returncode and "has no running pod" in ex.stderr, ex.stderr
    hint = re.search(r"Hint: `(gtrain [^`]+)`", ssh.stderr)
    assert hint is not None, ssh.stderr
    argv = shlex.split(hint.group(1))
    assert argv[:2] == ["gtrain", "launch"], argv
    launched = cli(kube, tmp_path, *argv[1:])
    assert launched.returncode == 0, launched.stdout + launched.stderr

    # the job's lines, without gtrain's markers (followed to its end, then read again)
    followed = cli(kube, tmp_path, "logs", "k8s-cli", "-f")
    assert followed.returncode == 0, followed.stdout + followed.stderr
    again = cli(kube, tmp_path, "logs", "k8s-cli")
    for said in (followed.stdout, again.stdout):
        assert "slurm rank 3 step 2 sum 10.0" in said, said[-3000:]
        assert "rank-exit" not in said, said[-3000:]

    # the pods are over: no GPU to sample, as on a local cluster after its job
    gpus = cli(kube, tmp_path, "status", "k8s-cli", "--gpus")
    assert gpus.returncode == 0, gpus.stdout + gpus.stderr

    # down while a job runs: its lines are kept before its pods go
    doc = yaml.safe_load(Path(path).read_text())
    doc["job"]["run"] = "slurm_train.py --steps 600 --step-s 0.1"
    long = tmp_path / "long.yaml"
    long.write_text(yaml.safe_dump(doc))
    assert cli(kube, tmp_path, "launch", str(long)).returncode == 0
    wait_for(lambda: "rank 3 step 3 " in cli(kube, tmp_path, "logs", "k8s-cli", "--tail", "20").stdout)
    down = cli(kube, tmp_path, "down", "k8s-cli", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert kube.labelled("gtrain.dev/cluster") == []
    kept = cli(kube, tmp_path, "logs", "k8s-cli")
    assert kept.returncode == 0, kept.stderr
    for r in range(4):
        assert f"slurm rank {r} step 3 sum 10.0" in kept.stdout, kept.stdout[-3000:]
    assert "rank-exit" not in kept.stdout


def test_logs_after_cancel_keep_the_jobs_lines(kube: FakeKube, tmp_path: Path) -> None:
    """`cancel` deletes the job's pods, and their logs with them: the lines are kept first (as `down` does), so
    `gtrain logs` after a cancel prints them (it printed nothing, exit 0), `--tail` and `--rank` included."""
    path = spec(tmp_path, "k8s-cancel", "slurm_train.py --steps 600 --step-s 0.1")
    assert cli(kube, tmp_path, "up", path).returncode == 0
    try:
        assert cli(kube, tmp_path, "launch", path).returncode == 0

        def past_step_3() -> bool:  # any step of rank 3 from the 3rd on (the job steps every 0.1 s)
            steps = re.findall(r"slurm rank 3 step (\d+) ", cli(kube, tmp_path, "logs", "k8s-cancel", "--tail",
                                                               "20").stdout)
            return any(int(n) >= 3 for n in steps)

        wait_for(past_step_3)
        cancelled = cli(kube, tmp_path, "cancel", "k8s-cancel")
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        assert [n for n in kube.labelled("gtrain.dev/job") if n[0] == "pods"] == []  # the pods are gone
        kept = cli(kube, tmp_path, "logs", "k8s-cancel")
        assert kept.returncode == 0, kept.stderr
        for r in range(4):
            assert f"slurm rank {r} step 3 sum 10.0" in kept.stdout, kept.stdout[-3000:]
        assert "rank-exit" not in kept.stdout
        one = cli(kube, tmp_path, "logs", "k8s-cancel", "--rank", "1", "--tail", "2").stdout.splitlines()
        assert len(one) == 2 and all("slurm rank 1 " in x for x in one), one
    finally:
        cli(kube, tmp_path, "down", "k8s-cancel", "--yes")
