"""The container command gtrain builds for a node (gtrain.containers.runtime / pull): flags, names, refusals."""

from __future__ import annotations

import pytest

from gtrain.containers.pull import pull_command
from gtrain.containers.runtime import check_options, container_name, run_argv
from gtrain.errors import ConfigError
from gtrain.spec import Job


def job(**kw: object) -> Job:
    return Job.model_validate({"run": "train.py", "image": "nvcr.io/nvidia/pytorch:25.01-py3", **kw})


def argv(j: Job, gpus: bool) -> list[str]:
    return run_argv(j, cluster="c1", job_id="c1-1", node_rank=1, gpus=gpus, mounts=["/r/workdir", "/r/jobs/x",
                    "/r/workdir"], workdir="/r/workdir")


def test_run_argv_flags_gpus_mounts_and_image_last() -> None:
    a = argv(job(container={"mounts": [{"host": "/fsx", "path": "/data", "read_only": True}],
                            "options": ["--cap-add=SYS_PTRACE"]}), gpus=True)
    s = " ".join(a)
    assert a[:2] == ["docker", "run"] and a[-1] == "nvcr.io/nvidia/pytorch:25.01-py3"
    for flag in ("--rm -i --init", "--name gtrain-c1-c1-1-n1", "--label gtrain.cluster=c1", "--label gtrain.job=c1-1",
                 "--network host", "--ipc host", "--pid host", "--shm-size 16g", "--gpus all",
                 "-v /fsx:/data:ro", "-w /r/workdir", "--cap-add=SYS_PTRACE"):
        assert flag in s
    assert s.count("-v /r/workdir:/r/workdir") == 1
    assert "--gpus" not in argv(job(), gpus=False)
    pod = argv(job(container={"runtime": "podman"}), gpus=False)
    assert pod[0] == "podman" and "--pid" in pod and "--ipc" in pod
    # podman refuses --init with the host's PID namespace and --shm-size with the host's IPC namespace
    assert "--init" not in pod and "--shm-size" not in pod


def test_cluster_cleanup_finds_containers_by_label() -> None:
    import subprocess

    from gtrain.containers.runtime import cluster_cleanup_command

    cmd = cluster_cleanup_command("c'1")
    assert "label=gtrain.cluster=c'\"'\"'1" in cmd and "docker podman" in cmd
    assert subprocess.run(["bash", "-n", "-c", cmd]).returncode == 0


def test_container_name_is_safe() -> None:
    assert container_name("a b", "j/1;x", 0) == "gtrain-a-b-j-1-x-n0"


@pytest.mark.parametrize("opt", ["--network=bridge", "--gpus", "-v", "--env=X=1", "--pid=container:x", "--name=x"])
def test_owned_options_refused(opt: str) -> None:
    with pytest.raises(ConfigError) as e:
        check_options(job(container={"options": [opt]}).container)  # type: ignore[arg-type]
    assert e.value.field == "job.container.options" and opt in e.value.message


def test_enroot_refused_on_vm_nodes() -> None:
    with pytest.raises(ConfigError) as e:
        argv(job(container={"runtime": "enroot"}), gpus=False)
    assert e.value.field == "job.container.runtime"


def test_pull_logs_in_on_stdin_into_a_private_config() -> None:
    cmd = pull_command(job(image_credentials={"username": "$oauthtoken", "password_secret": "NGC_API_KEY"}))
    assert "--password-stdin" in cmd and "'$oauthtoken'" in cmd and "nvcr.io" in cmd
    assert "DOCKER_CONFIG=\"$__cfg\"" in cmd and "rm -rf" in cmd and "NGC_API_KEY" not in cmd
    assert "login" not in pull_command(job())
