"""How two writers' copies of one cluster object are merged after a lost conditional write."""

from __future__ import annotations

from gtrain.sharedstate.store import merge


def _doc(status: str, jobs: list[tuple[str, str, float]]) -> dict:  # type: ignore[type-arg]
    return {"cluster": {"id": "c-1", "name": "c", "status": status}, "nodes": [{"rank": 0, "status": status}],
            "jobs": [{"id": i, "status": s, "created_at": t} for i, s, t in jobs]}


def test_the_lease_holder_keeps_the_cluster_and_a_final_job_wins() -> None:
    ours = _doc("terminating", [("j1", "running", 1.0), ("j2", "pending", 2.0)])
    theirs = _doc("up", [("j1", "succeeded", 1.0), ("j3", "running", 3.0)])
    m = merge(ours, theirs, ours_win=True)
    assert m["cluster"]["status"] == "terminating" and m["nodes"] == ours["nodes"]
    assert [(j["id"], j["status"]) for j in m["jobs"]] == [("j1", "succeeded"), ("j2", "pending"), ("j3", "running")]


def test_a_writer_without_the_lease_keeps_only_its_jobs() -> None:
    ours = _doc("up", [("j1", "failed", 1.0)])
    theirs = _doc("terminated", [("j1", "running", 1.0)])
    m = merge(ours, theirs, ours_win=False)
    assert m["cluster"]["status"] == "terminated"
    assert [(j["id"], j["status"]) for j in m["jobs"]] == [("j1", "failed")]


def test_who_ran_it_is_the_ci_run_else_user_at_host(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import getpass
    import socket

    from gtrain.state.identity import identity

    for k in ("GITHUB_ACTIONS", "GITLAB_CI", "GTRAIN_IDENTITY"):
        monkeypatch.delenv(k, raising=False)
    assert identity() == f"{getpass.getuser()}@{socket.gethostname()}"
    monkeypatch.setenv("GITLAB_CI", "true")
    monkeypatch.setenv("CI_JOB_URL", "https://gitlab.example/g/p/-/jobs/7")
    assert identity() == "https://gitlab.example/g/p/-/jobs/7"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_RUN_ID", "9")
    monkeypatch.setenv("GITHUB_REPOSITORY", "o/r")
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    assert identity() == "https://github.com/o/r/actions/runs/9"
