"""Render the per-node scripts from ``templates/`` (jinja2). Every value a user controls reaches the shell
only through the ``q`` filter (``shlex.quote``); StrictUndefined makes a missing variable an error. The
launcher block of ``launch.sh`` is the chosen launcher's command (:mod:`gtrain.jobs.launchers`)."""

from __future__ import annotations

from gtrain.jobs.templating import NodeContext, render, shell_quote, templates_dir

__all__ = ["SCRIPTS", "NodeContext", "container_command", "render", "render_all", "shell_quote", "templates_dir"]


def container_command(ctx: NodeContext) -> str:
    """The node's exact container command line (``launch.sh`` adds InfiniBand devices when the node has them;
    the secrets go to it on stdin)."""
    import shlex

    argv = ctx.container_argv
    inner = shlex.join([argv[-1], "bash", f"{ctx.job_dir}/container.sh"])
    return (shlex.join(argv[:-1]) + ' "${__gtrain_dev[@]}" ' + inner
            + "\n# ${__gtrain_dev[@]}: launch.sh adds --ulimit memlock=-1 where the node's hard limit allows it and "
              "--device /dev/infiniband where the node has it")

SCRIPTS = ("launch.sh", "rank.sh", "setup.sh", "data.sh")


def render_all(ctx: NodeContext) -> dict[str, str]:
    """The node's files: ``launch.sh``, the launcher's own (``rank.sh``, ...), ``command`` (the launcher's
    command line for this node, as ``launch.sh`` runs it) and ``setup.sh`` when the job has one."""
    from gtrain.jobs.launchers import get_launcher

    launcher = get_launcher(ctx.launcher)
    command = launcher.node_command(ctx)
    from gtrain.containers.runtime import NODE_FLAGS

    out = {"launch.sh": render("launch.sh", ctx, launcher_command=command, launcher_name=launcher.name,
                               container_node_flags=NODE_FLAGS),
           **launcher.node_files(ctx), "command": command + "\n"}
    if ctx.container_argv:  # job.image: launch.sh runs container.sh (the launcher) inside the node's container
        from dataclasses import replace

        inner = replace(ctx, checkpoint_store="")  # the checkpoint agent stays on the host, beside the job
        out["container.sh"] = render("container.sh", inner, launcher_command=command)
        out["command"] = container_command(ctx) + "\n"
    if ctx.setup:
        out["setup.sh"] = render("setup.sh", ctx)
    out.update(metrics_files())  # py/gtrain/metrics.py: `import gtrain.metrics` works on every rank
    if ctx.secret_names:  # launch.sh and rank.sh write the job's output through it (the secrets masked)
        out["mask.py"] = mask_source()
    return out


def mask_source() -> str:
    """The node's output filter (:mod:`gtrain.remote.nodemask`, stdlib only), shipped as ``JOB/mask.py``."""
    from pathlib import Path

    from gtrain.remote import nodemask

    return Path(nodemask.__file__).read_text(encoding="utf-8")


def metrics_files() -> dict[str, str]:
    """Job-dir-relative path -> text: a copy of :mod:`gtrain.metrics` under ``py/gtrain/`` (rank.sh puts ``py`` at
    the end of PYTHONPATH). No ``__init__.py``: it is a namespace portion, so an installed gtrain wins over it."""
    from pathlib import Path

    import gtrain.metrics

    return {"py/gtrain/metrics.py": Path(gtrain.metrics.__file__).read_text(encoding="utf-8")}
