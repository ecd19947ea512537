"""How core code reports progress without printing: a Reporter with no-op defaults.

The CLI subclasses it to render with rich on stderr; the Python API takes one (or uses the silent default).
"""

from __future__ import annotations


class Reporter:
    def info(self, msg: str) -> None:
        """A step the user should see ("creating 2 nodes")."""

    def warn(self, msg: str) -> None:
        """Something went wrong but the command goes on."""

    def node(self, rank: int, msg: str) -> None:
        """Progress of one node ("node 1: ssh ready")."""

    def line(self, node: int, rank: int | None, text: str) -> None:
        """One line of a job's output: ``rank`` None is the node's own (setup, torchrun agent) output."""


SILENT = Reporter()
