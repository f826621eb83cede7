"""The fast tier's rule: a test not marked ``slow`` starts no process.

``python -m pytest -m "not slow"`` is the quick check CI runs before everything else, so it must
stay quick: no ``embeddb serve`` daemons, torchrun jobs, pip or docker runs, no multiprocessing
workers. This module is a pytest plugin (``tests/conftest.py`` loads it): from the start of a
test's setup (module and session fixtures it sets up included) to the end of its teardown, a
test not marked ``slow`` runs under a :class:`ProcessGuard`. Each way of starting a process then
raises :class:`FastTierProcessError`, and the guard remembers the attempt, so a test whose code
swallowed the error still fails, at teardown.
"""

from __future__ import annotations

import _posixsubprocess
import multiprocessing.process
import os
import subprocess
from collections.abc import Callable, Generator
from typing import Any

import pytest

MESSAGE = "mark this test slow: the fast tier starts no processes"


class FastTierProcessError(RuntimeError):
    """A test outside the ``slow`` tier tried to start a process."""


# Every door to a new process: subprocess (also behind asyncio, os.popen, torchrun's launcher),
# fork and posix_spawn (os.spawn*, pty), os.system, multiprocessing's Process.start (also behind
# ProcessPoolExecutor and torch.multiprocessing) and the fork_exec that its spawn and forkserver
# start methods call directly.
_DOORS: tuple[tuple[Any, str, str], ...] = (
    (subprocess.Popen, "__init__", "subprocess.Popen"),
    (os, "fork", "os.fork"),
    (os, "forkpty", "os.forkpty"),
    (os, "posix_spawn", "os.posix_spawn"),
    (os, "posix_spawnp", "os.posix_spawnp"),
    (os, "system", "os.system"),
    (multiprocessing.process.BaseProcess, "start", "multiprocessing Process.start"),
    (_posixsubprocess, "fork_exec", "_posixsubprocess.fork_exec"),
)


def _command(door: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """`` for [argv]``: what ``subprocess.Popen`` or ``os.system`` was asked to run, cut to a
    line; empty for the other doors."""
    if door == "subprocess.Popen":
        command = kwargs.get("args", args[1] if len(args) > 1 else None)
    elif door == "os.system":
        command = args[0] if args else None
    else:
        return ""
    text = repr(command)
    return f" for {text[:160]}{'...' if len(text) > 160 else ''}"


class ProcessGuard:
    """Closes the doors of ``_DOORS`` while installed; ``attempts`` names each door tried."""

    def __init__(self) -> None:
        self.attempts: list[str] = []
        self.reported = False  # a FastTierProcessError ended the setup or the call
        self._saved: list[tuple[Any, str, Any]] = []

    def _refuse(self, door: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            self.attempts.append(door)
            raise FastTierProcessError(f"{door} called{_command(door, args, kwargs)}: {MESSAGE}")

        return refused

    def install(self) -> None:
        for owner, name, door in _DOORS:
            if hasattr(owner, name):
                self._saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, self._refuse(door))

    def uninstall(self) -> None:
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)

    def failure(self) -> str | None:
        """The teardown message when a process start was attempted and its error did not end
        the setup or the call (code caught it), else ``None``."""
        if not self.attempts or self.reported:
            return None
        return f"the test tried to start a process ({', '.join(self.attempts)}): {MESSAGE}"


_GUARD = pytest.StashKey[ProcessGuard]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    if item.get_closest_marker("slow") is None:
        guard = ProcessGuard()
        guard.install()
        item.stash[_GUARD] = guard
    return (yield from _noting_refusals(item))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _noting_refusals(item))


def _noting_refusals(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    except FastTierProcessError:
        guard = item.stash.get(_GUARD, None)
        if guard is not None:
            guard.reported = True
        raise


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    guard = item.stash.get(_GUARD, None)
    try:
        result = yield
    finally:
        if guard is not None:
            guard.uninstall()
    failure = guard.failure() if guard is not None else None
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    return result
