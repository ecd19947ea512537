"""Runs on the Ray cluster as the entrypoint of a short Ray job (``python _gtrain_exec/nodeexec.py``), for
:class:`gtrain.providers.ray.execjob.ExecBatch`: one step's commands, every node's, side by side. For each: it
writes the files shipped for it beside this file in the job's working_dir, runs one ``bash -c`` command with
the secrets it names on its stdin (as NUL-separated ``NAME=value`` records, the form every node script reads
them in) and prints one ``[gtrain-exec] {json}`` line: its index, exit code, stdout and stderr, the secrets'
values masked in every form ``nodemask.py`` (shipped beside it) knows. The values come from the one-off GCS
package ``exec.json`` names (``secrets_uri``), read and deleted first -- the one use of Ray's own API here, made
only when there are secrets; otherwise standard library only."""

import json
import os
import subprocess
import sys
import threading
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def take_secrets(uri: str) -> dict:
    """The ``NAME=value`` records of the one-off package gtrain uploaded, deleted once read."""
    import ray
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get

    ray.init(log_to_driver=False)
    try:
        data = bytes(_internal_kv_get(uri) or b"")
        _internal_kv_del(uri)
    finally:
        ray.shutdown()
    out = {}
    for rec in data.split(b"\0"):
        name, sep, value = rec.decode("utf-8", "surrogateescape").partition("=")
        if sep:
            out[name] = value
    return out


def load_nodemask() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gtrain_nodemask", os.path.join(HERE, "nodemask.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def one(i: int, c: dict, env: dict, secrets: dict, lock: threading.Lock, mask: Any, blobs: dict) -> None:
    try:
        for path, mode, name in c["files"]:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            tmp = f"{path}.gtrain-tmp"
            with open(tmp, "wb") as dst:
                dst.write(blobs[name])
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        stdin = b"".join(f"{n}={secrets.get(n, '')}".encode() + b"\x00" for n in c["stdin"]) if c["stdin"] else None
        res = subprocess.run(["bash", "-c", c["cmd"]], input=stdin, capture_output=True, env=env,
                             timeout=c.get("timeout"), cwd="/")
        doc = {"i": i, "rc": res.returncode, "stdout": mask.text(res.stdout.decode("utf-8", "replace")),
               "stderr": mask.text(res.stderr.decode("utf-8", "replace"))}
    except subprocess.TimeoutExpired:
        doc = {"i": i, "rc": 124, "stdout": "", "stderr": f"timed out after {c.get('timeout')} s"}
    except (OSError, subprocess.SubprocessError) as e:
        doc = {"i": i, "rc": 255, "stdout": "", "stderr": f"{type(e).__name__}: {e}"}
    with lock:
        print("[gtrain-exec] " + json.dumps(doc), flush=True)


def main() -> int:
    with open(os.path.join(HERE, "exec.json")) as f:
        plan = json.load(f)
    env = dict(os.environ)
    # everything of this folder read before ray.init: Ray's agent may unpack the working_dir again under it
    nodemask = load_nodemask()
    blobs = {}
    for c in plan["commands"]:
        for _path, _mode, name in c["files"]:
            if name not in blobs:
                with open(os.path.join(HERE, "files", name), "rb") as f:
                    blobs[name] = f.read()
    secrets = take_secrets(plan["secrets_uri"]) if plan.get("secrets_uri") else {}
    mask = nodemask.Masker([v for v in secrets.values() if v])
    lock = threading.Lock()
    threads = [threading.Thread(target=one, args=(i, c, env, secrets, lock, mask, blobs))
               for i, c in enumerate(plan["commands"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
