"""Run on worker 0 of a Cloud TPU slice when ``policies.max_hours`` / ``max_cost_usd`` / ``idle_minutes`` fire
(armed by :mod:`gtrain.providers.gcp.tpu.limits`): delete the slice through the TPU API v2 with the VM's own
credentials, so nothing keeps billing with no laptop and no gtrain process left (a TPU node has no
``maxRunDuration``, and powering a worker off does not end the slice).

``python3 tpu-self-delete.py ENDPOINT METADATA NODE QUEUED``: an access token from the metadata server
(``METADATA/computeMetadata/v1/instance/service-accounts/default/token`` with ``Metadata-Flavor: Google``, as on
GCE: https://cloud.google.com/compute/docs/access/authenticate-workloads#applications), then
``DELETE ENDPOINT/v2/QUEUED?force=true`` (a queued resource, with its node:
https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources/delete) when QUEUED is not
``-``, and ``DELETE ENDPOINT/v2/NODE`` (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/delete).
404 is done. Other failures are retried for 10 minutes. Standard library only: it runs on the node."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request

RETRY_S = 600


def token(metadata: str) -> str:
    req = urllib.request.Request(f"{metadata.rstrip('/')}/computeMetadata/v1/instance/service-accounts/default/token",
                                 headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 (the metadata server)
        return str(json.load(r)["access_token"])


def delete(endpoint: str, name: str, tok: str, force: bool) -> str:
    url = f"{endpoint.rstrip('/')}/v2/{name}" + ("?force=true" if force else "")
    req = urllib.request.Request(url, method="DELETE", headers={"Authorization": f"Bearer {tok}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 (the TPU API)
            op = json.load(r)
        return f"deleting (operation {op.get('name', '?')})"
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return "already gone"
        raise


def main(argv: list[str]) -> int:
    endpoint, metadata, node, queued = argv[:4]
    deadline, delay = time.time() + RETRY_S, 2.0
    while True:
        try:
            tok = token(metadata)
            for name, force in ((queued, True), (node, False)):
                if name != "-":
                    print(f"gtrain tpu self-delete: DELETE {name}: {delete(endpoint, name, tok, force)}", flush=True)
            return 0
        except (OSError, ValueError, KeyError) as e:  # urllib's errors are OSErrors
            print(f"gtrain tpu self-delete: {e}", flush=True)
            if time.time() > deadline:
                return 1
            time.sleep(delay)
            delay = min(delay * 2, 60.0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
