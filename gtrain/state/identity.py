"""Who runs this gtrain, as status, cost and the report say it (and the shared state's leases)."""

from __future__ import annotations

import getpass
import os
import socket


def identity() -> str:
    """Who runs this gtrain: the CI run's URL (GitHub Actions, GitLab CI), else ``user@host``."""
    env = os.environ
    if env.get("GITHUB_ACTIONS") == "true" and env.get("GITHUB_RUN_ID"):
        server = env.get("GITHUB_SERVER_URL", "https://github.com").rstrip("/")
        return f"{server}/{env.get('GITHUB_REPOSITORY', '?')}/actions/runs/{env['GITHUB_RUN_ID']}"
    if env.get("GITLAB_CI") == "true" and env.get("CI_JOB_URL"):
        return env["CI_JOB_URL"]
    if env.get("GTRAIN_IDENTITY"):
        return env["GTRAIN_IDENTITY"]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"
