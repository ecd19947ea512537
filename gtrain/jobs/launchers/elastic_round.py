"""Shipped to the nodes of an elastic run (stdlib + torch): agree on the checkpoint a rendezvous round resumes
from, through the c10d rendezvous store that node 0's torchrun agent hosts (docs/durable.md, "Elastic runs").

Usage: elastic_round.py HOST PORT ROUND set NAME | get. ``get`` waits (up to 10 minutes) for the node of group
rank 0 to ``set`` the round's NAME and prints it."""

from __future__ import annotations

import datetime
import sys


def main() -> int:
    from torch.distributed import TCPStore

    host, port, round_id, op = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    store = TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=600))
    key = f"gtrain/elastic/{round_id}"
    if op == "set":
        store.set(key, sys.argv[5])
    else:
        print(store.get(key).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
