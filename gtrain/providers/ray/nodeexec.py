"""Runs on the Ray cluster as the entrypoint of a short Ray job (``python _gtrain_exec/nodeexec.py``), for
:class:`gtrain.providers.ray.execjob.ExecBatch`: one step's commands, every node's, side by side. For each: it
writes the files shipped for it beside this file in the job's working_dir, runs one ``bash -c`` command with
the secrets it names on its stdin (as NUL-separated ``NAME=value`` records, the form every node script reads
them in; their values come in the job's runtime_env ``env_vars`` and are taken out of the commands'
environment) and prints one ``[gtrain-exec] {json}`` line: its index, exit code, stdout and stderr. Standard
library only."""

import json
import os
import subprocess
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))


def one(i: int, c: dict, env: dict, secrets: dict, lock: threading.Lock) -> None:
    try:
        for path, mode, name in c["files"]:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            tmp = f"{path}.gtrain-tmp"
            with open(os.path.join(HERE, "files", name), "rb") as src, open(tmp, "wb") as dst:
                dst.write(src.read())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        stdin = b"".join(f"{n}={secrets.get(n, '')}".encode() + b"\x00" for n in c["stdin"]) if c["stdin"] else None
        res = subprocess.run(["bash", "-c", c["cmd"]], input=stdin, capture_output=True, env=env,
                             timeout=c.get("timeout"), cwd="/")
        doc = {"i": i, "rc": res.returncode, "stdout": res.stdout.decode("utf-8", "replace"),
               "stderr": res.stderr.decode("utf-8", "replace")}
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
    names = {n for c in plan["commands"] for n in c["stdin"]}
    secrets = {n: env.pop(n, "") for n in names}
    lock = threading.Lock()
    threads = [threading.Thread(target=one, args=(i, c, env, secrets, lock))
               for i, c in enumerate(plan["commands"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
