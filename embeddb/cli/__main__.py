"""``python -m embeddb.cli``: the ``embeddb`` command (the cluster starts its shards this way)."""

from embeddb.cli import main

main(prog_name="embeddb")
