"""``python -m embeddb``: the ``embeddb`` command (the same as the installed entry point)."""

from __future__ import annotations

from embeddb.cli import main

if __name__ == "__main__":
    main(prog_name="embeddb")
