"""Runs on the Ray cluster as the entrypoint of a short Ray job (``python _gtrain_exec/nodeexec.py``), for
:class:`gtrain.providers.ray.execjob.RayExec`: it writes the files shipped beside it in the job's working_dir,
runs one ``bash -c`` command with the secrets named in ``GTRAIN_RAY_EXEC_STDIN`` on its stdin (as NUL-separated
``NAME=value`` records, the form every node script reads them in; their values come in the job's runtime_env
``env_vars`` and are taken out of the command's environment) and prints one ``[gtrain-exec] {json}`` line:
the exit code, stdout and stderr. Standard library only."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    with open(os.path.join(HERE, "exec.json")) as f:
        plan = json.load(f)
    for path, mode, name in plan["files"]:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.gtrain-tmp"
        with open(os.path.join(HERE, "files", name), "rb") as src, open(tmp, "wb") as dst:
            dst.write(src.read())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    env = dict(os.environ)
    names = [n for n in env.pop("GTRAIN_RAY_EXEC_STDIN", "").split(",") if n]
    stdin = b"".join(f"{n}={env.pop(n, '')}".encode() + b"\x00" for n in names) if names else None
    res = subprocess.run(["bash", "-c", plan["cmd"]], input=stdin, capture_output=True, env=env,
                         timeout=plan.get("timeout"), cwd=plan.get("cwd") or "/")
    print("[gtrain-exec] " + json.dumps({"rc": res.returncode, "stdout": res.stdout.decode("utf-8", "replace"),
                                         "stderr": res.stderr.decode("utf-8", "replace")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
