"""A hostile corpus: specs and command lines a mistyping user or an attacker writes. Every case runs the real
CLI entry point (``gtrain.cli.app.main``, the one place that turns exceptions into exit codes) in-process and
must end as promised: exit 2 with one ``Error:`` line naming the field (or, for a valid input, exit 0), no
traceback, no "this is a bug", in under a second of CPU time (and 10 s of wall time: no hang), and nothing
created in GTRAIN_HOME.

The cases are data (``SPECS``, ``JOB_SPECS``, ``COMMANDS``, ``VALID``); add a line to add a case."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gtrain.cli.app import main
from gtrain.signals import HANDLED

B = "name: demo\n"
JOB = "name: demo\njob:\n  workdir: wd\n  run: train.py\n"


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # "{spec}" stands for the case's spec file, "{tmp}" for its folder
    text: str | bytes | None = None  # the spec file's content
    needle: str = ""  # what the error must name (the field or flag); "" for a valid case
    code: int = 2


def _yaml(v: object) -> str:
    import json

    return json.dumps(v)  # JSON is YAML: exact values without quoting mistakes


def spec_cases() -> list[Case]:
    """Spec files `up --dry-run` must refuse: (field, values) over every section."""
    bad: dict[str, list[object]] = {
        "name": ["", "Demo", "-a", "a-", "a" * 41, "a_b", "a b", "1abc", "a.b", 123, True, ["a"], {"a": 1}, "é",
                 "a\u200bb", "../x", "a/b", "a;b", "$(id)", "a\nb", None],
        "num_nodes": [0, -1, 513, 17, 1.5, "two", True, False, [], {}, 10**30, "1e400", -(10**20)],
        "provider": ["nope", 1, [], "LOCAL", "", True, "../local", "local;id"],
        "bogus": [1, None, "x"],
        "Name": ["demo"],
        "resources": ["big", 1, ["A100"], {"bogus": 1}],
        "resources.accelerators": ["A100:0", "A100:17", "A100:x", ":8", "A100:8:1", 8, True, [], "A100:-1",
                                   "A 100", "A100:99999999999999999999"],
        "resources.disk_gb": [5, 70000, True, "big", 1.5, -1, [10]],
        "resources.region": [[], 1, {"a": 1}],
        "resources.regions": ["us-east-1", [1], {"a": 1}],
        "resources.zones": ["a", {"a": 1}],
        "resources.use_spot": ["maybe", 2, [], {}],
        "resources.image_id": [[], {}],
        "resources.instance_type": [[], 5],
        "policies": ["x", []],
        "policies.idle_minutes": [0, -1, True, 1e9, "x", []],
        "policies.max_hours": [0, 9000, True, "x", -0.5],
        "policies.max_cost_usd": [-5, 1e8, True, 0],
        "policies.preflight": ["sometimes", 1, True, "QUICK!"],
        "policies.min_gpu_util": ["x", 5, {"percent": 200}, {"percent": -1}, {"bogus": 1}, {"percent": True},
                                  {"minutes": True}, {"action": "explode"}],
        "policies.recovery": ["x", 5, {"bogus": 1}],
        "job": ["train.py", 1, []],
        "job.run": ["", "'unclosed", [], "   ", {"a": 1}],
        "job.workdir": [[], "a\x00b", {}],
        "job.launcher": ["nope", 1, "", "torchrun;id", "TORCHRUN"],
        "job.nproc_per_node": [0, 65, True, 1.5, "x", -3],
        "job.env": ["A=1", ["A"], {"1A": "x"}, {"A": ["x"]}, {"A": {"b": 1}}, {"GTRAIN_X": "1"}, {"A B": "x"},
                    {"RANK": "x"}, {"": "x"}, {"A-B": "x"}, {"A": "x\x00y"}, {"WORLD_SIZE": "2"}],
        "job.secrets": ["X", [1], ["PATH"], ["1A"], ["GTRAIN_JOB_ID"], ["A", "A"], ["HOME"], ["LD_PRELOAD"],
                       ["A B"], [["A"]], {"A": 1}, ["RANK"]],
        "job.checkpoint_dir": ["/abs", "../x", "", "a\x00", "a/../../b", [], "/", "~/x/../../.."],
        "job.data": ["s3://b", [{"src": "http://x", "dst": "d"}], [{"src": "s3://bkt", "dst": "/abs"}],
                     [{"src": "s3://bkt", "dst": "../x"}], [{"src": "s3://bkt", "dst": ".", "delete": True}],
                     [{"src": "s3://u:p@bkt", "dst": "d"}], [{"src": "s3://bkt/../x", "dst": "d"}],
                     [{"src": "s3://bkt"}], [{"src": "s3://bkt", "dst": "d", "bogus": 1}],
                     [{"src": "ftp://bkt", "dst": "d"}], [{"src": "s3://bkt", "dst": "d", "delete": "yes please"}],
                     [{"src": "s3://bkt", "dst": "a/../.."}], [{"src": "s3://bkt", "dst": ""}], [1]],
        "job.max_restarts": [-1, 101, True, "x", 1.5],
        "job.checkpoint_store": ["http://x", "s3://", "s3://AKIA:secret@bkt/x", "s3://bkt/../x", 1, "s3://a",
                                 "gs://tok@bkt/x", "s3://bkt//x", "/local/dir"],
        "job.python": ["py\x00", [], {}],
        "job.container": [{"runtime": "docker"}],
        "job.image_credentials": [{"username": "u", "password_secret": "P"}],
        "job.accelerate": [{"config_file": "a.yaml"}],
        "job.deepspeed": [{"bogus": 1}],
        "job.jax": [{"bogus": 1}],
        "job.bogus": [1],
        "job.setup": [[], {}, "a\x00b"],
    }
    out: list[Case] = []
    for path, values in bad.items():
        for i, v in enumerate(values):
            parts = path.split(".")
            doc: dict[str, object] = {"name": "demo"}
            if parts[0] == "job" and path != "job":
                doc["job"] = {"run": "train.py", parts[1]: v}
            elif len(parts) == 2:
                doc[parts[0]] = {parts[1]: v}
            else:
                doc[path] = v
            out.append(Case(f"spec-{path}-{i}", ("up", "--dry-run", "{spec}"), _yaml(doc), path))
    return out


def provider_cases() -> list[Case]:
    ssh_hosts = ["-oProxyCommand=x", "a\nb", "user@-h", "-u@h", "h:0", "h:70000", "h:abc", "$(id)", "a b", "`id`",
                 "a;b", "", "a\rb", "u@h@h", "h|x", "[::1", "h:-1", "-", "a\tb"]
    ssh_dicts: list[object] = [{"host": "-x"}, {"host": "h", "user": "-l"}, {"host": "h", "port": 0},
                               {"host": "h", "address": "$(id)"}, {"host": "a\nb"}, {"host": ""},
                               {"host": "h", "bogus": 1}, {"host": "h", "user": "a b"}, {"host": "h", "port": True}]
    out = [Case(f"ssh-host-{i}", ("up", "--dry-run", "{spec}"),
                _yaml({"name": "demo", "provider": "ssh", "ssh": {"hosts": [h]}}), "ssh.hosts")
           for i, h in enumerate([*ssh_hosts, *ssh_dicts])]
    for i, (k, v) in enumerate([("user", "-x"), ("user", "a\nb"), ("user", "$(id)"), ("user", ""), ("port", 0),
                                ("port", 70000), ("port", True), ("hosts", []), ("hosts", "h1"), ("bogus", 1),
                                ("host_keys", ["x"]), ("check_torch", "maybe"), ("user", "root;id"),
                                ("python", "a\nb"), ("proxy_jump", "-oProxyCommand=id"), ("proxy_jump", "a b"),
                                ("identity_file", "k\x00"), ("proxy_command", "nc %h %p\nid"), ("port", "22a")]):
        out.append(Case(f"ssh-{k}-{i}", ("up", "--dry-run", "{spec}"),
                        _yaml({"name": "demo", "provider": "ssh", "ssh": {"hosts": ["h1"], k: v}}), f"ssh.{k}"))
    out += [Case("ssh-none", ("up", "--dry-run", "{spec}"), _yaml({"name": "demo", "provider": "ssh"}), "ssh"),
            Case("ssh-list", ("up", "--dry-run", "{spec}"), _yaml({"name": "demo", "provider": "ssh", "ssh": ["h"]}),
                 "ssh"),
            Case("ssh-too-few", ("up", "--dry-run", "{spec}"),
                 _yaml({"name": "demo", "provider": "ssh", "num_nodes": 3, "ssh": {"hosts": ["h1"]}}), "num_nodes"),
            Case("ssh-section-for-local", ("up", "--dry-run", "{spec}"),
                 _yaml({"name": "demo", "ssh": {"hosts": ["h1"]}}), "ssh")]
    slurm: list[tuple[str, object]] = [
        ("login", "$(id)"), ("login", "-oProxyCommand=x"), ("login", "a b"), ("login", "u@h:x"), ("login", "u@@h"),
        ("login", "`id`@h"), ("login", "u@h;id"), ("login", "a\nb"), ("login", "-l@h"),
        ("extra_sbatch", ["--"]), ("extra_sbatch", ["-"]), ("extra_sbatch", ["--x=a\rb"]),
        ("extra_sbatch", ["--x\nb"]), ("extra_sbatch", ["mem=0"]), ("extra_sbatch", ["--job-name=x"]),
        ("extra_sbatch", ["--nodes=2"]), ("extra_sbatch", "--mem"), ("extra_sbatch", [1]), ("extra_sbatch", [""]),
        ("extra_sbatch", ["#SBATCH"]), ("extra_sbatch", ["--mem=1\x00"]), ("extra_sbatch", ["-- "]),
        ("extra_sbatch", ["--output=/tmp/x"]), ("extra_sbatch", ["--x=\x1b[2J"]),
        ("time", "forever"), ("time", "1:2:3:4"), ("gres_style", "x"), ("signal", "$(id)"),
        ("rate_per_gpu_hour", -1), ("bogus", 1), ("exclusive", "maybe"), ("hold", []), ("rate_per_gpu_hour", True),
        ("partition", "a\nb"), ("shared_dir", "a\x00b"), ("conf", "x\ny"), ("python", "python3\nid"),
        ("account", "a\rb"), ("login_identity_file", "k\x00"), ("qos", ["x"]), ("constraint", "a\x1bb")]
    out += [Case(f"slurm-{k}-{i}", ("up", "--dry-run", "{spec}"),
                 _yaml({"name": "demo", "provider": "slurm", "slurm": {"login": "u@login1", k: v}}), f"slurm.{k}")
            for i, (k, v) in enumerate(slurm)]
    out += [Case("slurm-spot", ("up", "--dry-run", "{spec}"),
                 _yaml({"name": "demo", "provider": "slurm", "resources": {"use_spot": True}}), "use_spot"),
            Case("local-bogus", ("up", "--dry-run", "{spec}"), B + "local:\n  bogus: 1\n", "local.bogus"),
            Case("local-list", ("up", "--dry-run", "{spec}"), B + "local: [1]\n", "local"),
            Case("local-spot", ("up", "--dry-run", "{spec}"), B + "resources: {use_spot: true}\n", "use_spot"),
            Case("local-17", ("up", "--dry-run", "{spec}"), B + "num_nodes: 17\n", "num_nodes")]
    return out


def section_cases() -> list[Case]:
    """Issue 40: fields of the feature and provider sections that were wrongly accepted."""
    kimg = {"run": "t.py", "image": "pytorch/pytorch:2.5.1"}
    kube: list[tuple[str, object, str]] = [
        ("context", "a\nb", "context"), ("context", "a\x00b", "context"), ("context", "a\x1b[2Jb", "context"),
        ("node_selector", {"pool\n": "a"}, "node_selector"), ("node_selector", {"pool": "a\nb"}, "node_selector"),
        ("node_selector", {"pool": "a\x00"}, "node_selector"), ("node_selector", {"p\x1bq": "a"}, "node_selector"),
        ("tolerations", [{"key": "a\nb"}], "tolerations"), ("tolerations", [{"key": "k", "value": "v\x00"}],
                                                             "tolerations"),
        ("tolerations", [{"key": "k", "value": "\x1b[2J"}], "tolerations"),
        ("shm_gb", True, "shm_gb"), ("shm_gb", float("inf"), "shm_gb"), ("shm_gb", 1e6, "shm_gb"),
        ("volumes", [{"claim": "d", "mount": "/data/../etc"}], "volumes"),
        ("volumes", [{"claim": "d", "mount": "/data:rw"}], "volumes"),
        ("volumes", [{"claim": "d", "mount": "/da\nta"}], "volumes"),
        ("volumes", [{"claim": "d", "mount": "/data"}, {"claim": "e", "mount": "/data/"}], "volumes"),
        ("volumes", [{"claim": "d", "mount": "/gtrain/x"}], "volumes"),
        ("volumes", [{"claim": "d", "mount": "/gtrain-ckpt"}], "volumes"),
        ("volumes", [{"claim": "d", "mount": "/dev"}], "volumes"),
        ("volumes", [{"claim": "d", "mount": "//gtrain-bundle"}], "volumes")]
    out = [Case(f"kube-{k}-{i}", ("up", "--dry-run", "{spec}"),
                _yaml({"name": "demo", "provider": "kubernetes", "kubernetes": {k: v}, "job": kimg}),
                f"kubernetes.{needle}") for i, (k, v, needle) in enumerate(kube)]
    out.append(Case("kube-merge", ("up", "--dry-run", "{spec}"), "name: demo\nprovider: kubernetes\nx: &b {shm_gb: 1}"
                    "\nkubernetes:\n  <<: *b\njob: {run: t.py, image: 'pytorch/pytorch:2.5.1'}\n", "kubernetes"))
    ray: list[tuple[str, object]] = [
        ("runtime_env", {"env_vars": {"RANK": "0"}}), ("runtime_env", {"env_vars": {"MASTER_ADDR": "h"}}),
        ("runtime_env", {"env_vars": {"GTRAIN_NODE_RANK": "1"}}), ("runtime_env", {"env_vars": {"A B": "1"}}),
        ("runtime_env", {"pip": ["x"], "bogus": 1}), ("runtime_env", {"working_dir": "."}),
        ("root", "/etc"), ("root", "/usr"), ("root", "/usr/local/gtrain"), ("root", "/opt"), ("root", "/etc/gtrain"),
        ("address", "http://u:sekret@head:8265"), ("address", "http://head:8265/?token=tok3n"),
        ("address", "https://head:8265/x?access_token=tok3n"), ("address", "http://sekret@head:8265")]
    out += [Case(f"ray-{k}-{i}", ("up", "--dry-run", "{spec}"),
                 _yaml({"name": "demo", "provider": "ray", "ray": {"address": "http://h:8265", k: v}}), f"ray.{k}")
            for i, (k, v) in enumerate(ray)]
    track: list[tuple[str, object]] = [
        ("tensorboard", "/"), ("tensorboard", "/etc"), ("tensorboard", "/usr/share/tb"), ("tensorboard", "../tb"),
        ("tensorboard", "a/../../tb"), ("tensorboard", "tb\x1b"),
        ("mlflow", {"tracking_uri": "http://u:sekret@h:5000"}), ("mlflow", {"tracking_uri": "https://h/?token=tok3n"}),
        ("mlflow", {"tracking_uri": "databricks://tok3n@ws"}), ("mlflow", {"tracking_uri": "http://h/?password=x"}),
        ("mlflow", {"tracking_uri": "http://h:5000", "token_secret": "https://u:sekret@h"}),
        ("mlflow", {"tracking_uri": "http://h:5000", "experiment": "a\nb"}),
        ("wandb", {"project": "p\x1b[2J"}), ("wandb", {"project": "p", "api_key_secret": "sk-tok3n:x"})]
    out += [Case(f"tracking-{k}-{i}", ("up", "--dry-run", "{spec}"),
                 _yaml({"name": "demo", "job": {"run": "t.py", "tracking": {k: v}}}), f"job.tracking.{k}")
            for i, (k, v) in enumerate(track)]
    notify: list[tuple[str, object]] = [
        ("webhook", {"url_secret": "https://hooks.slack.com/services/tok3n"}), ("webhook", {"url_secret": "A\nB"}),
        ("email", {"to": ["a\x00b@c.de"], "smtp_secret": "S"}), ("email", {"to": ["a@b.d\x1be"], "smtp_secret": "S"}),
        ("email", {"to": ["a@b.de"], "smtp_secret": "smtp://u:sekret@h:25"}),
        ("email", {"to": ["a@b.de"], "smtp_secret": "S", "sender": "x@y.de\nBcc: e@v.il"}),
        ("command", "notify-send\x00x"), ("command", "a\nb")]
    out += [Case(f"notify-{k}-{i}", ("up", "--dry-run", "{spec}"), _yaml({"name": "demo", "notify": {k: v}}),
                 f"notify.{k}") for i, (k, v) in enumerate(notify)]
    out.append(Case("energy-source-esc", ("up", "--dry-run", "{spec}"),
                    _yaml({"name": "demo", "energy": {"grid_source": "x\x1b[2J"}}), "energy.grid_source"))
    azure: list[tuple[str, object]] = [
        ("ssh_user", "root"), ("ssh_user", "admin"), ("ssh_user", "administrator"), ("ssh_user", "guest"),
        ("tags", {f"t{i}": "v" for i in range(51)}), ("tags", {"a": "b\nc"}), ("ssh_cidr", "1.2.3.4/33"),
        ("ssh_cidr", "300.1.1.1/32"), ("ssh_cidr", "10.0.0.0/8\nx"), ("vnet_cidr", "10.0.0.1/33"),
        ("vnet_cidr", "127.0.0.0/16"), ("vnet_cidr", "169.254.0.0/16"), ("vnet_cidr", "0.0.0.0/8"),
        ("ssh_proxy_command", "ssh -W %h:22 b\nProxyCommand id")]
    out += [Case(f"azure-{k}-{i}", ("up", "--dry-run", "{spec}"),
                 _yaml({"name": "demo", "provider": "azure", "resources": {"accelerators": "A100:8"}, "azure": {k: v}}),
                 f"azure.{k}") for i, (k, v) in enumerate(azure)]
    lam: list[tuple[str, object]] = [("file_system_names", ["fs\nx"]), ("file_system_names", ["fs\x00"]),
                                     ("file_system_names", ["../fs"]), ("idle_command", ["shutdown\nid"]),
                                     ("ssh_proxy_command", "nc %h 22\x00")]
    out += [Case(f"lambda-{k}-{i}", ("up", "--dry-run", "{spec}"),
                 _yaml({"name": "demo", "provider": "lambda", "resources": {"accelerators": "H100:8"},
                        "lambda": {k: v}}),
                 f"lambda.{k}") for i, (k, v) in enumerate(lam)]
    opts = ["-itd", "-d", "-ti", "-v/:/host", "-v=/:/host", "-eTOKEN=sekret", "-e=A", "--volumes-from=other",
            "--volumes-from", "-dit", "-w/x", "-lx=y", "--env=A=1", "--name=x", "-iv/:/h", "x", "--privileged",
            "--privileged=true"]
    out += [Case(f"container-opt-{i}", ("up", "--dry-run", "{spec}"),
                 _yaml({"name": "demo", "job": {"run": "t.py", "image": "pytorch/pytorch:2.5.1",
                                                "container": {"options": [o]}}}), "job.container.options")
            for i, o in enumerate(opts)]
    tpu = [("local", {"accelerators": "tpu-v5p-8"}, {}, "resources.accelerators"),
           ("aws", {"accelerators": "tpu-v5p-8"}, {}, "resources.accelerators"),
           ("gcp", {"accelerators": "tpu-v5p-8"}, {"run": "t.py", "nproc_per_node": 64}, "job.nproc_per_node"),
           ("gcp", {"accelerators": "tpu-v5p-8"}, {"run": "t.py", "nproc_per_node": 5}, "job.nproc_per_node"),
           (None, {"accelerators": "tpu-v5p-8", "any_of": [{"provider": "gcp"}, {"provider": "aws"}]}, {},
            "candidate #2")]
    for i, (prov, res, job, needle) in enumerate(tpu):
        doc: dict[str, object] = {"name": "demo", "resources": res, **({"provider": prov} if prov else {})}
        out.append(Case(f"tpu-{i}", ("up", "--dry-run", "{spec}"), _yaml({**doc, **({"job": job} if job else {})}),
                        needle))
    tspec = _yaml({"name": "demo", "provider": "gcp", "resources": {"accelerators": "tpu-v5p-8"}})
    gspec = _yaml({"name": "demo", "resources": {"accelerators": "A100:1"}})
    out += [Case("flag-gpus-on-tpu", ("up", "--dry-run", "{spec}", "--gpus", "A100:8"), tspec, "--gpus"),
            Case("flag-spot-on-demand", ("up", "--dry-run", "{spec}", "--spot", "--on-demand"), gspec, "--spot"),
            Case("flag-on-demand-spot", ("up", "--dry-run", "{spec}", "--on-demand", "--spot"), gspec, "--spot")]
    return out


def yaml_cases() -> list[Case]:
    """The file itself: control characters, numbers no field needs, bombs, nesting, tags, encodings."""
    raw: list[tuple[str, str | bytes, str]] = [
        ("nul", "name: de\x00mo\n", "SPEC"), ("bel", "name: demo\x07\n", "SPEC"),
        ("esc", "name: \x1b[2Jdemo\n", "SPEC"),
        ("nul-key", "na\x00me: demo\n", "SPEC"), ("del", B + "x: \x7f\n", "x"),
        ("c1", "name: demo\x85x\n", "SPEC"), ("bigint", B + "num_nodes: " + "9" * 100_000 + "\n", "num_nodes"),
        ("bigint-job", B + "job:\n  max_restarts: " + "1" * 5000 + "\n", "job.max_restarts"),
        ("bigfloat", B + "policies:\n  max_hours: 1." + "1" * 5000 + "\n", "policies.max_hours"),
        ("bigneg", B + "num_nodes: -" + "9" * 5000 + "\n", "num_nodes"),
        ("hexbig", B + "num_nodes: 0x" + "f" * 5000 + "\n", "num_nodes"),
        ("inf", B + "policies:\n  max_hours: .inf\n", "policies.max_hours"),
        ("ninf", B + "policies:\n  idle_minutes: -.inf\n", "policies.idle_minutes"),
        ("nan", B + "policies:\n  max_cost_usd: .nan\n", "policies.max_cost_usd"),
        ("nan-nodes", B + "num_nodes: .nan\n", "num_nodes"),
        ("inf-disk", B + "resources:\n  disk_gb: .inf\n", "disk_gb"),
        ("bool-nodes", B + "num_nodes: true\n", "num_nodes"), ("bool-disk", B + "resources:\n  disk_gb: yes\n", "disk"),
        ("bool-restarts", B + "job:\n  run: t.py\n  max_restarts: false\n", "max_restarts"),
        ("bool-nproc", B + "job:\n  run: t.py\n  nproc_per_node: on\n", "nproc_per_node"),
        ("bool-hours", B + "policies:\n  max_hours: true\n", "max_hours"),
        ("dup", "name: a\nname: b\n", "name"), ("dup-deep", B + "job:\n  run: a\n  run: b\n", "job.run"),
        ("deep-flow", B + "x: " + "[" * 200 + "]" * 200 + "\n", "x"),
        ("deep-map", B + "x: " + "{a: " * 200 + "1" + "}" * 200 + "\n", "x"),
        ("deep-block", B + "".join("  " * i + f"k{i}:\n" for i in range(80)) + "  " * 80 + "v: 1\n", "k0"),
        ("deep-unclosed", B + "x: " + "[" * 100_000 + "\n", "x"),
        ("laughs", "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                   "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                   "e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nname: demo\n", "aliases"),
        ("self-alias", "name: demo\nx: &a [*a]\n", "alias"), ("undefined-alias", "name: *nope\n", "SPEC"),
        ("top-list", "- name: demo\n", "SPEC"), ("top-scalar", "demo\n", "SPEC"), ("top-int", "5\n", "SPEC"),
        ("empty", "", "empty"), ("comments", "# nothing\n", "empty"), ("two-docs", "name: a\n---\nname: b\n", "SPEC"),
        ("python-tag", "name: !!python/object:os.system [id]\n", "SPEC"), ("unknown-tag", "name: !foo demo\n", "SPEC"),
        ("binary-tag", "num_nodes: !!binary aGk=\nname: demo\n", "num_nodes"),
        ("set-tag", "name: !!set {a, b}\n", "name"),
        ("latin1", b"name: d\xe9mo\n", "SPEC"), ("garbage", bytes(range(256)), "SPEC"),
        ("tabs", "name: demo\njob:\n\trun: t.py\n", "SPEC"), ("bad-indent", "name: demo\n  x: 1\n", "SPEC"),
        ("unclosed-quote", "name: 'demo\n", "SPEC"), ("unclosed-flow", "name: [demo\n", "SPEC"),
        ("huge", B + "x: '" + "a" * (1 << 20) + "'\n", "SPEC"), ("key-list", "[a]: 1\nname: demo\n", "SPEC"),
        ("key-null", "~: 1\nname: demo\n", "None"), ("key-int", "1: 1\nname: demo\n", "1"),
        ("merge-bad", "name: demo\nx:\n  <<: 5\n", "SPEC"),
        # a merge key anywhere in a spec (it was refused only in `kubernetes:`): one line naming where it is
        ("merge-top", "b: &b {name: demo}\n<<: *b\n", "a YAML merge key"),
        ("merge-policies", B + "b: &b {max_hours: 1}\npolicies:\n  <<: *b\n  idle_minutes: 5\n", "policies"),
        ("merge-env", JOB + "  env:\n    <<: {A: '1'}\n", "job.env"),
        ("merge-host", B + "provider: ssh\nh: &h {host: a.lan}\nssh:\n  hosts: [{<<: *h, user: u}]\n",
         "ssh.hosts[0]"),
        ("merge-seq", B + "a: &a {x: 1}\nc: &c {y: 2}\nresources:\n  <<: [*a, *c]\n", "resources"),
        ("many-unknown", B + "".join(f"k{i}: 1\n" for i in range(2_000)), "more problem"),
        ("many-keys", B + "".join(f"k{i}: 1\n" for i in range(24_000)), "more than 5,000 keys"),
        ("many-secrets", B + "job:\n  run: t.py\n  secrets: [" + ", ".join(f"S{i}" for i in range(4_500))
         + ", S1]\n", "job.secrets"),
        ("secret-twice-many", B + "job:\n  run: t.py\n  secrets: [" + ", ".join(f"S{i % 2_000}" for i in range(4_000))
         + "]\n", "more"),
        ("many-items", B + "job:\n  run: t.py\n  secrets: [" + ", ".join(f"S{i}" for i in range(45_000))
         + "]\n", "more than 5,000 items"),
        ("env-many-bad", B + "job:\n  run: t.py\n  env: {" + ", ".join(f"'{i}x': v" for i in range(5000)) + "}\n",
         "job.env"),
    ]
    return [Case(f"yaml-{name}", ("up", "--dry-run", "{spec}"), text, "spec.yaml" if needle == "SPEC" else needle)
            for name, text, needle in raw]


ACC = "  workdir: wd\n  run: train.py\n  launcher: accelerate\n  accelerate: "


def job_cases() -> list[Case]:
    """Job checks `run` makes before `up` creates anything (a workdir wd/ with train.py and a file ckfile)."""
    raw: list[tuple[str, str, str]] = [
        ("outside", "  workdir: wd\n  run: ../outside.py\n", "job.run"),
        ("outside-deep", "  workdir: wd\n  run: sub/../../outside.py\n", "job.run"),
        ("missing-script", "  workdir: wd\n  run: nope.py\n", "job.run"),
        ("missing-workdir", "  workdir: nope\n  run: train.py\n", "job.workdir"),
        ("workdir-file", "  workdir: wd/train.py\n  run: train.py\n", "job.workdir"),
        ("ckpt-file", "  workdir: wd\n  run: train.py\n  checkpoint_dir: ckfile\n", "job.checkpoint_dir"),
        ("secret-unset", "  workdir: wd\n  run: train.py\n  secrets: [GTRAIN_CORPUS_UNSET_X]\n", "job.secrets"),
        ("accel-missing", ACC + "{config_file: no.yaml}\n",
         "job.accelerate.config_file"),
        ("accel-deep", ACC + "{config_file: deep.yaml}\n",
         "job.accelerate.config_file"),
        ("accel-list", ACC + "{config_file: list.yaml}\n",
         "job.accelerate.config_file"),
        ("accel-bigint", ACC + "{config_file: big.yaml}\n",
         "job.accelerate.config_file"),
        ("accel-nul", ACC + "{config_file: nul.yaml}\n",
         "job.accelerate.config_file"),
        ("accel-outside", "  workdir: wd\n  run: train.py\n  launcher: accelerate\n"
         "  accelerate: {config_file: ../x.yaml}\n", "job.accelerate.config_file"),
        ("ds-missing", "  workdir: wd\n  run: train.py\n  launcher: deepspeed\n  deepspeed: {config_file: no.json}\n",
         "job.deepspeed"),
    ]
    # `run` is the command that must check all this before `up` makes anything
    return [Case(f"job-run-{name}", ("run", "{spec}"), "name: demo\njob:\n" + body, needle)
            for name, body, needle in raw]


def command_cases() -> list[Case]:
    """Flags checked before anything is looked up or made."""
    out: list[Case] = []
    for i, to in enumerate(["", "   ", "/proc/1/x", "/proc", "/dev/null", "/dev/x/y", "/sys/x", "{tmp}/afile/x",
                            "{tmp}/afile/x/y/z", "/etc/passwd/x"]):
        out.append(Case(f"pull-to-{i}", ("pull", "demo", "--to", to), needle="--to"))
    for i, v in enumerate(["nan", "inf", "-inf", "0", "0.1", "1e9", "-1", "NaN", "3601"]):
        out.append(Case(f"top-interval-{i}", ("top", "demo", "--interval", v), needle="--interval"))
    out.append(Case("top-interval-text", ("top", "demo", "--interval", "abc"), needle="--interval"))
    for i, r in enumerate(["mars-1; id", "US-EAST-1", "", "a b", "$(id)", "-x", "us-east-1\n", "../x", "a" * 70,
                           "us_east_1"]):
        out.append(Case(f"gc-region-{i}", ("gc", "--region", r), needle="--region"))
    out.append(Case("gc-provider", ("gc", "--provider", "local"), needle="--provider"))
    for i, url in enumerate(["s3://AKIAX:sekret@bkt/x", "gs://tok3n@bkt/x", "az://k3y:v@c/x", "s3://sekret@bkt",
                             "S3://AKIAX:sekret@bkt"]):
        out.append(Case(f"sync-cred-src-{i}", ("sync", url, "{tmp}/d"), needle="credentials"))
        out.append(Case(f"sync-cred-dst-{i}", ("sync", "{tmp}", url), needle="credentials"))
    for i, args in enumerate([("logs", "demo", "--tail", "-1"), ("logs", "demo", "--rank", "-1"),
                              ("logs", "demo", "--node", "-2"), ("pull", "demo", "--node", "-1")]):
        out.append(Case(f"flag-negative-{i}", args, needle=args[2]))
    for i, p in enumerate(["/dev/null", "{tmp}/fifo", "{tmp}", "{tmp}/nope.yaml", "/dev/zero"]):
        out.append(Case(f"spec-path-{i}", ("up", "--dry-run", p), needle="spec file"))
    out.append(Case("spec-path-proc", ("up", "--dry-run", "/proc/self/status"), needle="invalid spec"))
    return out


VALID: list[Case] = [
    Case("ok-min", ("up", "--dry-run", "{spec}"), B, code=0),
    Case("ok-nodes", ("up", "--dry-run", "{spec}"), B + "num_nodes: 2\n", code=0),
    Case("ok-accel", ("up", "--dry-run", "{spec}"), B + "resources:\n  accelerators: a100:2\n", code=0),
    Case("ok-env-text", ("up", "--dry-run", "{spec}"), JOB + "  env: {A: 0.00001, B: yes, C: 0755, D: 1_000}\n",
         code=0),
    Case("ok-data", ("up", "--dry-run", "{spec}"), JOB + "  data: [{src: 's3://bkt/x', dst: data, delete: true}]\n",
         code=0),
    Case("ok-data-dot", ("up", "--dry-run", "{spec}"), JOB + "  data: [{src: 's3://bkt/x', dst: .}]\n", code=0),
    Case("ok-store", ("up", "--dry-run", "{spec}"), JOB + "  checkpoint_store: s3://bkt/runs\n", code=0),
    Case("ok-ssh", ("up", "--dry-run", "{spec}"),
         "name: demo\nprovider: ssh\nssh:\n  user: ubuntu\n  hosts: [10.0.0.5, 'me@gpu-1.lan:2222', '[::1]:22', "
         "{host: h_2, user: a.b-c}]\n", code=0),
    Case("ok-slurm", ("up", "--dry-run", "{spec}"),
         "name: demo\nprovider: slurm\nslurm:\n  login: u@login-1:22\n"
         "  extra_sbatch: ['--mem=0', '#SBATCH --mem-per-cpu=2G', '--mail-type END']\n", code=0),
    Case("ok-ckpt-dot", ("up", "--dry-run", "{spec}"), JOB + "  checkpoint_dir: .\n", code=0),
    Case("ok-policies", ("up", "--dry-run", "{spec}"), B + "policies:\n  max_hours: 1.5\n  idle_minutes: 30\n", code=0),
    Case("ok-big-number-quoted", ("up", "--dry-run", "{spec}"), JOB + "  env: {N: '" + "9" * 5000 + "'}\n", code=0),
    Case("ok-unicode-env", ("up", "--dry-run", "{spec}"), JOB + "  env: {GREETING: 'héllo ✓'}\n", code=0),
    Case("ok-kube", ("up", "--dry-run", "{spec}"), "name: demo\nprovider: kubernetes\nkubernetes:\n  shm_gb: 64\n"
         "  node_selector: {example.com/pool: gpu-a}\n  volumes: [{claim: data, mount: /data}, {claim: m, mount: "
         "/models/}]\n  tolerations: [{key: nvidia.com/gpu, operator: Exists}]\njob: {run: t.py, image: 'a/b:1'}\n",
         code=0),
    Case("ok-ray", ("up", "--dry-run", "{spec}"), "name: demo\nprovider: ray\nray:\n  address: http://h:8265\n"
         "  root: /tmp/gtrain-ray\n  runtime_env: {pip: [x], env_vars: {LR: '1'}}\n", code=0),
    Case("ok-tpu", ("up", "--dry-run", "{spec}"), "name: demo\nprovider: gcp\nresources: {accelerators: tpu-v5p-8}"
         "\njob: {run: t.py, nproc_per_node: 4}\n", code=0),
    Case("ok-tracking", ("up", "--dry-run", "{spec}"), JOB + "  tracking: {tensorboard: /scratch/tb, mlflow: "
         "{tracking_uri: 'http://h:5000/?experiment=3'}}\n", code=0),
    Case("ok-container", ("up", "--dry-run", "{spec}"), JOB + "  image: 'a/b:1'\n  container: {options: "
         "['--cap-add=SYS_PTRACE', '-u1000', '--shm-size=1g']}\n", code=0),
]

CASES: list[Case] = [*spec_cases(), *provider_cases(), *section_cases(), *yaml_cases(), *job_cases(),
                     *command_cases(), *VALID]


def test_corpus_size() -> None:
    assert len(CASES) >= 400, len(CASES)
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    """Import what the commands import once, so a case's time is its own work."""
    _cli(("up", "--dry-run", "/nonexistent/spec.yaml"))
    _cli(("top", "x", "--interval", "nan"))
    _cli(("sync", "s3://a:b@c", "/nonexistent"))
    _cli(("gc", "--region", "x y"))


def _cli(argv: tuple[str, ...]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["gtrain", *argv]
    handlers = {s: signal.getsignal(s) for s in HANDLED}  # main() installs gtrain's: pytest keeps its own
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
        for s, h in handlers.items():
            signal.signal(s, h)
    return code, out.getvalue(), err.getvalue()


def _workdir(tmp: Path) -> None:
    wd = tmp / "wd"
    (wd / "sub").mkdir(parents=True)
    (wd / "train.py").write_text("print('hi')\n")
    (wd / "ckfile").write_text("not a folder\n")
    (wd / "deep.yaml").write_text("distributed_type: " + "[" * 5000 + "]" * 5000 + "\n")
    (wd / "list.yaml").write_text("- MULTI_GPU\n")
    (wd / "big.yaml").write_text("num_processes: " + "7" * 100_000 + "\n")
    (wd / "nul.yaml").write_bytes(b"distributed_type: MULTI\x00GPU\n")
    (tmp / "outside.py").write_text("print('outside')\n")
    (tmp / "x.yaml").write_text("distributed_type: NO\n")
    (tmp / "afile").write_text("a file\n")
    os.mkfifo(tmp / "fifo")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_case(case: Case, tmp_path: Path, gtrain_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GTRAIN_CORPUS_UNSET_X", raising=False)
    _workdir(tmp_path)
    spec = tmp_path / "spec.yaml"
    if case.text is not None:
        (spec.write_bytes if isinstance(case.text, bytes) else spec.write_text)(case.text)  # type: ignore[operator]
    argv = tuple(a.replace("{spec}", str(spec)).replace("{tmp}", str(tmp_path)) for a in case.argv)
    t, cpu = time.monotonic(), time.process_time()
    code, out, err = _cli(argv)
    took, cpu = time.monotonic() - t, time.process_time() - cpu
    assert code == case.code, (case.id, code, err[-2000:])
    assert "Traceback" not in err + out and "this is a bug" not in err, err[-2000:]
    if case.code == 2:
        first = err.splitlines()[0] if err else ""
        assert first.startswith("Error: ") or first.startswith("Usage:") or "Error" in err, err[-2000:]
        assert case.needle in err, (case.needle, err[-2000:])
        assert len(err) < 4000, len(err)  # a few problems and a count, never a 3 MB line
        for secret in ("sekret", "tok3n", "k3y:v", "secret@"):
            assert secret not in err, err  # a credential in a URL is never repeated
    # under a second of work (CPU time: the 2 shared cores of CI are no measure of gtrain), and no hang
    assert cpu < 1.0 and took < 10.0, f"{case.id} took {cpu:.2f}s of CPU, {took:.2f}s in all"
    assert not gtrain_home.exists() or not any(gtrain_home.iterdir()), sorted(os.listdir(gtrain_home))
