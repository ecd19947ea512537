"""Lambda Cloud's rules the fake now holds (issue 40), on tests/fixtures/fake_lambda.py: both 404 codes mean gone
(two teardowns racing), the published rate limits (paced, not 429'd), a preempted instance is a lost node, and a
launch request carries no ``quantity`` (API 1.10.0 lists none)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest

import gtrain
from gtrain.errors import ProviderError
from gtrain.events import SILENT
from gtrain.providers import get_provider
from gtrain.providers.lambda_cloud.api import LambdaAPI
from gtrain.providers.lambda_cloud.teardown import LambdaTeardown
from gtrain.spec import parse_spec
from gtrain.state import StateStore
from tests.fixtures.fake_lambda import FakeLambda
from tests.integration.test_lambda import everything, spec

PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEXAMPLEEXAMPLEEXAMPLEEXAMPLEEXAMPLEEXAMPLE test"


def test_two_teardowns_racing_both_succeed(fake_lambda: FakeLambda) -> None:
    api = LambdaAPI()
    api.add_ssh_key("gtrain-race1", PUB)
    api.launch("us-east-1", "gpu_1x_a10", "gtrain-race1", "gtrain-race1-0", [])
    listed = threading.Barrier(2, timeout=10)
    real = api.ssh_keys

    def ssh_keys() -> list[dict[str, Any]]:  # both list the key before either deletes it
        keys = real()
        if any(k["name"] == "gtrain-race1" for k in keys):
            listed.wait()
        return keys

    errors: list[BaseException] = []
    left: list[list[str]] = []

    def down() -> None:
        own = LambdaAPI()
        own.ssh_keys = ssh_keys  # type: ignore[method-assign]
        t = LambdaTeardown(own, cast(Any, None), SILENT, poll_s=0.05, timeout_s=20)
        try:
            left.append(t.teardown("race1"))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=down) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [], errors  # the loser's DELETE /ssh-keys/{id} answered 404 global/not-found: gone
    assert left == [[], []]
    assert fake_lambda.of_cluster("race1") == {"instance": [], "ssh-key": []}


def test_three_node_up_is_paced_within_the_rate_limits(fake_lambda: FakeLambda, gtrain_home: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    before = everything(fake_lambda)
    fake_lambda.pace(request_interval=0.1, launch_interval=0.6)  # the real 1 s / 12 s, scaled down
    monkeypatch.setenv("LAMBDA_API_PACE", "0.1,0.6")
    launched = len(fake_lambda.launches)
    res = gtrain.up(parse_spec(spec("lam-pace", num_nodes=3)))
    try:
        assert res.cluster is not None and res.cluster.status == "up"
        assert fake_lambda.throttled == 0  # no 429 at all: gtrain stayed within the limits
        bodies = fake_lambda.launches[launched:]
        assert len(bodies) == 3 and all("quantity" not in b for b in bodies), bodies
    finally:
        gtrain.down("lam-pace")
    assert everything(fake_lambda) == before


def test_a_429_is_retried_after_retry_after(fake_lambda: FakeLambda) -> None:
    fake_lambda.pace(request_interval=0.5, launch_interval=0.5)
    api = LambdaAPI()
    api.pacer.request_s = 0.0  # gtrain not pacing: the fake answers 429 with Retry-After: 1
    api.instances()
    t0 = time.monotonic()
    api.instances()
    assert fake_lambda.throttled == 1 and time.monotonic() - t0 >= 0.9


def test_a_preempted_instance_is_a_lost_node(fake_lambda: FakeLambda, gtrain_home: Path) -> None:
    before = everything(fake_lambda)
    res = gtrain.up(parse_spec(spec("lam-pre")))
    assert res.cluster is not None
    store = StateStore()
    try:
        p = get_provider("lambda", store)
        cluster = store.get_cluster_by_id(res.cluster.id)
        rank1 = next(n.instance_id for n in p.node_records(cluster) if n.rank == 1)
        with fake_lambda.lock:
            fake_lambda.instances[str(rank1)]["status"] = "preempted"
        assert [s.status for s in p.describe(cluster)] == ["running", "preempted"]
    finally:
        store.close()
        gtrain.down("lam-pre")
    assert everything(fake_lambda) == before
    # preempted while booting: the launch gives up at once instead of waiting out boot_timeout_s
    s = spec("lam-pre2", **{"lambda": {"wait_ssh": False, "poll_s": 0.05, "boot_timeout_s": 20}})
    t0 = time.monotonic()
    with pytest.raises(ProviderError) as e:
        _up_with_preempted_rank(fake_lambda, s, rank=1)
    assert "preempted before it became active" in e.value.message, e.value.message
    assert time.monotonic() - t0 < 15
    assert everything(fake_lambda) == before  # what the failed attempt made is gone


def _up_with_preempted_rank(fake: FakeLambda, s: dict[str, Any], rank: int) -> None:
    real = fake._launch

    def launch(b: dict[str, Any]) -> list[str]:
        if str(b.get("name") or "").endswith(f"-{rank}"):
            fake.preempt.add(str(b["name"]))
        return real(b)

    fake._launch = launch  # type: ignore[method-assign]
    try:
        gtrain.up(parse_spec(s))
    finally:
        del fake._launch


def test_gc_lists_and_cleans_a_preempted_orphan(fake_lambda: FakeLambda, gtrain_home: Path) -> None:
    """A preempted instance runs nothing but is still listed and still holds the cluster's SSH key (a DELETE of
    the key answers ``ssh-keys/key-in-use``): `gc` must list it, terminate it and then delete the key."""
    before = everything(fake_lambda)
    api = LambdaAPI()
    api.add_ssh_key("gtrain-preorph1", PUB)
    iid = api.launch("us-east-1", "gpu_1x_a10", "gtrain-preorph1", "gtrain-preorph1-0", [])[0]
    with fake_lambda.lock:
        fake_lambda.instances[iid]["status"] = "preempted"
    store = StateStore()
    try:
        p = get_provider("lambda", store)
        with fake_lambda.lock:  # another test's cluster in the session's fake is not this test's to sweep
            others = {str(i["name"]).rsplit("-", 1)[0][len("gtrain-"):] for i in fake_lambda.instances.values()}
            others |= {str(k["name"])[len("gtrain-"):] for k in fake_lambda.keys.values()}
        others.discard("preorph1")
        found = p.gc(None, others, delete=False)
        mine = sorted((o.kind, o.id) for o in found.orphans if o.cluster_id == "preorph1")
        assert mine == [("instance", iid), ("ssh-key", "gtrain-preorph1")], found.orphans
        done = p.gc(None, others, delete=True)
        assert done.deleted and done.left == [], done.left
    finally:
        store.close()
    assert everything(fake_lambda) == before
