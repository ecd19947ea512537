"""The command table: each command's module and its one-line help, so that `gtrain --help` is printed, and
the Typer group lists its commands, without importing any command module (see ``gtrain/cli/app.py``).

A test checks each line here against the command's own docstring (its first paragraph)."""

from __future__ import annotations

from gtrain.registry import REGISTRY

PROG = "gtrain"

ROOT_HELP = ("Run PyTorch training on GPU machines gtrain rents, and leave nothing running that nobody watches. "
             f"Providers: {', '.join(REGISTRY)} (and plug-ins).")

#: (name, module under gtrain.cli, help), in the order `gtrain --help` lists them
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("check", "check_cmds", "Which providers this machine can use now and why not: credentials, one read-only call, "
                            "GPU quota, SSH key."),
    ("up", "cluster_cmds", "Provision the cluster's nodes."),
    ("down", "cluster_cmds", "Stop jobs, delete every resource of the cluster, print what it cost."),
    ("stop", "cluster_cmds", "Stop a VM cluster's nodes (aws, gcp), keeping their disks: compute billing ends, the "
                             "disks bill on."),
    ("start", "cluster_cmds", "Start a stopped VM cluster's nodes again (aws, gcp); jobs can be launched once it "
                              "returns."),
    ("status", "cluster_cmds", "Clusters and their jobs."),
    ("launch", "job_cmds", "Sync the workdir, run setup, start job.launcher (default torchrun) on every node, "
                           "detached; print the job id."),
    ("logs", "job_cmds", "Every node's and rank's output, each line prefixed [node K rank R]."),
    ("pull", "job_cmds", "Bring checkpoint_dir back, every file verified by sha256; re-runs move only what changed."),
    ("run", "job_cmds", "up + launch --wait + pull + down, in one command; exits with the job's own exit code."),
    ("watch", "watch_cmds", "Follow the cluster's job to its end, recovering it from lost nodes; exit with the job's "
                            "exit code."),
    ("cancel", "job_cmds", "Stop the cluster's running job (or --job ID); the nodes and their files stay."),
    ("queue", "queue_cmds", "The cluster's queued jobs, as its nodes keep them: waiting (in the order they start), "
                            "running, ended."),
    ("plot", "report_cmds", "A metric of one or more jobs as a terminal chart; works after `down`, from what "
                            "gtrain kept."),
    ("report", "report_cmds", "One self-contained HTML report of a job: metrics, cost over time, GPU use, events, "
                              "spec, summary."),
    ("cost", "cost_cmds", "What every cluster ever run cost (running ones: so far)."),
    ("catalog", "cost_cmds", "GPU instance offers from the catalog (shipped, or your refreshed copy), cheapest first."),
    ("attach", "attach_cmds", "Adopt a running cluster by its tags/labels (no state needed): then status, logs, pull, "
                              "down work here."),
    ("volume", "volume_cmds", "Volumes that outlive clusters: gtrain volume ls | create -f SPEC NAME | delete NAME "
                              "(docs/volumes.md)."),
    ("gc", "gc_cmds", "List resources tagged by gtrain that no live cluster in state owns; delete them with --yes."),
    ("ssh", "node_cmds", "Open a shell on a node, or run CMD there: gtrain ssh CLUSTER [SSH-ARGS]... [-- CMD...]."),
    ("exec", "node_cmds", "Run a command on every node (or one): gtrain exec CLUSTER -- CMD ...; exit code = the worst "
                          "node's."),
    ("ssh-forget", "node_cmds", "Forget a host's pinned SSH key (after the host was rebuilt); the next `gtrain up` "
                                "pins the new one."),
    ("health", "health_cmds", "Check every node: GPUs vs the spec, ECC, Xid, an all-reduce, GEMM digests (silent data "
                              "corruption)."),
    ("top", "health_cmds", "A live view of every node's GPUs: utilisation, memory, temperature, power, steps/s."),
    ("notify", "notify_cmds", "Send a sample message to every target of the spec's notify: block (webhook, e-mail, "
                              "command)."),
    ("sync", "data_cmds", "Incremental, parallel, checksum-verified sync; an interrupted sync resumes."),
)

MODULES: dict[str, str] = {name: module for name, module, _ in COMMANDS}

#: the root's options as `--help` lists them (Typer adds the completion ones, click the help option)
ROOT_OPTIONS: tuple[tuple[str, str], ...] = (
    ("--version", "Show the version."),
    ("--install-completion", "Install completion for the current shell."),
    ("--show-completion", "Show completion for the current shell, to copy it or customize the installation."),
    ("-h, --help", "Show this message and exit."),
)
