"""Pull ``job.image`` on every node, in parallel, before anything of the job starts.

Once per node: an image the node already holds is not pulled again (``--pull=missing``, as ``docker run``
does). A registry login goes to ``docker login --password-stdin`` on stdin, into a private ``DOCKER_CONFIG``
folder (podman: ``REGISTRY_AUTH_FILE``) that is removed when the pull ends: the password never reaches argv, a
file left on the node, state or logs. A failure names the node, the image and the registry's answer.
"""

from __future__ import annotations

import os
import shlex
import time
from typing import TYPE_CHECKING

from gtrain.containers.runtime import vm_runtime
from gtrain.errors import ConfigError, GtrainError
from gtrain.remote.fanout import parallel
from gtrain.spec.containers import image_registry

if TYPE_CHECKING:
    from gtrain.events import Reporter
    from gtrain.remote.base import Runner
    from gtrain.spec import Job


class ImagePullError(GtrainError):
    """The image could not be pulled on a node: nothing of the job started."""


def check_credentials(job: Job) -> None:
    creds = job.image_credentials
    if creds is not None and creds.password_secret not in os.environ:
        raise ConfigError(f"job.image_credentials.password_secret: {creds.password_secret} is not set in this "
                          "environment", hint=f"export {creds.password_secret}=<registry password or token>",
                          field="job.image_credentials.password_secret")


def pull_command(job: Job) -> str:
    """The node's shell: log in (password on stdin) when credentials are given, pull when missing, then
    print ``pulled|cached SIZE``."""
    assert job.image is not None
    rt, image = vm_runtime(job), shlex.quote(job.image)
    lines = ["set -o pipefail", f"command -v {rt} >/dev/null || {{ echo '{rt} is not installed on this node' >&2;"
             " exit 127; }"]
    if job.image_credentials is not None:
        lines += ['__cfg=$(mktemp -d)', "trap 'rm -rf \"$__cfg\"' EXIT",
                  'export DOCKER_CONFIG="$__cfg" REGISTRY_AUTH_FILE="$__cfg/auth.json"',
                  f"{rt} login -u {shlex.quote(job.image_credentials.username)} --password-stdin "
                  f"{shlex.quote(image_registry(job.image))} >/dev/null || exit 3"]
    else:
        lines.append("exec 0</dev/null")
    lines += [f"if {rt} image inspect {image} >/dev/null 2>&1; then w=cached; else {rt} pull -q {image} >/dev/null"
              " || exit 4; w=pulled; fi",
              f'echo "$w $({rt} image inspect -f "{{{{.Size}}}}" {image})"']
    return "\n".join(lines)


def pull_all(job: Job, runners: list[Runner], report: Reporter) -> None:
    """Pull on every node; the first failure raises :class:`ImagePullError` naming node, image, answer."""
    assert job.image is not None
    creds = job.image_credentials
    stdin = os.environ[creds.password_secret].encode() if creds is not None else None
    cmd = pull_command(job)
    registry = image_registry(job.image)

    def one(i: int) -> None:
        r = runners[i]
        t0 = time.monotonic()
        res = r.run(cmd, stdin=stdin, timeout=3600, check=False)
        if res.rc != 0:
            what = {3: f"login to {registry} refused", 127: "no container runtime"}.get(res.rc, "pull failed")
            answer = res.stderr.strip()[-1500:] or res.stdout.strip()[-1500:]
            raise ImagePullError(f"{r.label}: {what} for image {job.image}: {answer}",
                                 hint="check job.image, job.image_credentials and that the node reaches "
                                      f"{registry}; nothing of the job was started")
        word, _, size = res.stdout.strip().rpartition("\n")[2].partition(" ")
        mb = f"{int(size) / 1e6:.0f} MB" if size.isdigit() else "size unknown"
        report.node(i, f"image {job.image} {word} ({mb}, {time.monotonic() - t0:.1f}s)")

    parallel(one, list(range(len(runners))))
