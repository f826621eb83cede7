"""Options read from the environment: one rule, applied by :func:`from_environment`.

The rule: ``EMBEDDB_`` + the command + the option's long name, upper case, dashes as
underscores. ``embeddb serve --max-message-mb`` reads ``EMBEDDB_SERVE_MAX_MESSAGE_MB``,
``embeddb serve-model --http-port`` reads ``EMBEDDB_SERVE_MODEL_HTTP_PORT`` and
``embeddb cluster --base-port`` reads ``EMBEDDB_CLUSTER_BASE_PORT``; the options of the
``embeddb`` group itself drop the command (``EMBEDDB_LOG_LEVEL``, ``EMBEDDB_LOG_FORMAT``,
``EMBEDDB_QUIET``). A flag is set by ``1``/``true``/``yes`` (``0``/``false``/``no`` clears it);
an option given many times (``--addresses``) takes a whitespace-separated list. The command line
wins over the environment, which wins over the default. ``--help`` shows each variable.

Variables an option already read keep working after the rule's name (``EMBEDDB_SHARD_INDEX``);
hidden options (set by ``embeddb cluster`` for its shards) read none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

__all__ = ["ENV_PREFIX", "envvar_name", "from_environment"]

ENV_PREFIX = "EMBEDDB"
C = TypeVar("C", bound=click.Command)


def envvar_name(command: str, option: click.Option) -> str:
    """The variable ``option`` of ``command`` (``""`` for the group) reads under the rule.

    Args:
        command: the command's name as typed (``serve-model``), or ``""``.
        option: one of its options; its first long name (``--max-delay-ms``) is used.
    """
    long_names = [opt for opt in option.opts if opt.startswith("--")] or option.opts
    words = (
        [ENV_PREFIX, command, long_names[0].lstrip("-")]
        if command
        else [
            ENV_PREFIX,
            long_names[0].lstrip("-"),
        ]
    )
    return "_".join(words).upper().replace("-", "_")


def from_environment(command_name: str) -> Callable[[C], C]:
    """A decorator (above ``@click.command``) giving every visible option of the command its
    variable under the rule, shown in ``--help``.

    Args:
        command_name: the command's name as typed, ``""`` for the ``embeddb`` group.
    """

    def apply(command: C) -> C:
        for param in command.params:
            if not isinstance(param, click.Option) or param.hidden or not param.expose_value:
                continue  # --version (no value) and internal options read no variable
            name = envvar_name(command_name, param)
            existing = param.envvar
            if existing is None:
                param.envvar = name
            else:
                kept = [existing] if isinstance(existing, str) else list(existing)
                param.envvar = [name, *(v for v in kept if v != name)]
            param.show_envvar = True
        return command

    return apply
