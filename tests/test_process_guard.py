"""The fast tier's rule (``tests/process_guard.py``): a test not marked slow starts no process."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest

from tests.process_guard import _GUARD, MESSAGE, FastTierProcessError, ProcessGuard


def _nothing() -> None:
    pass


def test_each_door_to_a_process_is_refused_and_reopened() -> None:
    before = (subprocess.Popen.__init__, os.fork, os.system, multiprocessing.Process.start)
    guard = ProcessGuard()
    guard.install()
    try:
        with pytest.raises(FastTierProcessError, match=MESSAGE):
            subprocess.run([sys.executable, "-c", "pass"], check=False)
        with pytest.raises(FastTierProcessError, match=MESSAGE):
            os.fork()
        with pytest.raises(FastTierProcessError, match=MESSAGE):
            os.system("true")
        with pytest.raises(FastTierProcessError, match=MESSAGE):
            multiprocessing.get_context("spawn").Process(target=_nothing).start()
    finally:
        guard.uninstall()
    after = (subprocess.Popen.__init__, os.fork, os.system, multiprocessing.Process.start)
    assert after == before
    assert guard.attempts == [
        "subprocess.Popen",
        "os.fork",
        "os.system",
        "multiprocessing Process.start",
    ]
    failure = guard.failure()
    assert failure is not None and MESSAGE in failure and "os.fork" in failure


def test_a_fast_test_runs_under_the_guard(request: pytest.FixtureRequest) -> None:
    guard = request.node.stash[_GUARD]
    with pytest.raises(
        FastTierProcessError, match=r"^subprocess.Popen called for \['true'\]: mark"
    ):
        subprocess.run(["true"], check=False)
    assert guard.attempts == ["subprocess.Popen"]
    guard.attempts.clear()  # the attempt was this test's point: it must not fail the teardown


@pytest.mark.slow
def test_a_slow_test_may_start_processes(request: pytest.FixtureRequest) -> None:
    assert _GUARD not in request.node.stash
    assert subprocess.run([sys.executable, "-c", "pass"], check=False).returncode == 0


@pytest.mark.slow
def test_the_guard_fails_fast_tests_that_start_processes(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    slow: longer-running tests\n")
    pytester.makepyfile(
        """
        import subprocess, sys
        import pytest

        @pytest.fixture(scope="module")
        def daemon():
            return subprocess.Popen([sys.executable, "-c", "pass"])

        def test_starts_one():
            subprocess.run([sys.executable, "-c", "pass"])

        def test_swallows_the_refusal():
            try:
                subprocess.run([sys.executable, "-c", "pass"])
            except Exception:
                pass

        def test_a_module_fixture_starts_one(daemon):
            pass

        @pytest.mark.slow
        def test_slow_starts_one():
            assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0

        def test_starts_none():
            pass
        """
    )
    result = pytester.runpytest("-p", "tests.process_guard", "-rA")
    result.assert_outcomes(passed=3, failed=1, errors=2)
    for line in (
        "FAILED *::test_starts_one*",
        "ERROR *::test_swallows_the_refusal*",
        "ERROR *::test_a_module_fixture_starts_one*",
        "PASSED *::test_slow_starts_one*",
        "PASSED *::test_starts_none*",
    ):
        result.stdout.fnmatch_lines([line])
    out = result.stdout.str()
    refusal = (
        f"FastTierProcessError: subprocess.Popen called for ['{sys.executable}', '-c', 'pass']"
    )
    # Count the traceback lines ("E   ..."): the short summary repeats the message only when the
    # terminal is wide enough, so the whole output's count depends on COLUMNS.
    raised = [
        line
        for line in out.splitlines()
        if line.startswith("E ") and f"{refusal}: {MESSAGE}" in line
    ]
    assert len(raised) == 2, out
    assert f"the test tried to start a process (subprocess.Popen): {MESSAGE}" in out, out
