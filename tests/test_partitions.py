"""Network partitions between hosts (issue 23): two shards, a follower of shard 0 and a client
host running a writer and an ``embeddb train`` job, each in its own network namespace on one
switch (``tests/netns_support.py``), with links cut and healed while writes and training run.

What must hold, as ``docs/operations.md`` ("Network partitions") describes:

* a write the client saw acknowledged is served by its primary after the heal;
* a write that failed during a cut names the unreachable shard and its address;
* a follower cut from its primary catches up after the heal: its rows equal the primary's;
* a training job whose shard is cut waits (its embedding worker retries the shard's calls,
  the retry naming the shard) and, healed within its retries, finishes.

Skipped (with the reason) where network namespaces cannot be made: not root, no iproute2, or a
sandbox that refuses ``ip netns``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.netns_support import (
    Agent,
    Lab,
    lab,
    netns_unavailable,
    read_writes,
    start_agent,
    write_ids,
    write_value,
)
from tests.support import START_TIMEOUT_S, eventually

pytestmark = pytest.mark.slow

WRITES_TABLE = "writes"
WRITES_DIM = 4
BATCH = 8
TRAIN_TIMEOUT_S = 150.0


@pytest.fixture
def net() -> Iterator[Lab]:
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(f"no network namespaces: {reason}")
    yield from lab()


def shards_config(path: Path) -> Path:
    """The Adult preset (the training job's tables) plus a table for the writer."""
    doc = yaml.safe_load(resources.files("embeddb.presets").joinpath("adult.yaml").read_text())
    doc["slots_config"][WRITES_TABLE] = {"dim": WRITES_DIM}
    path.write_text(yaml.safe_dump(doc))
    return path


def serve(net: Lab, host: str, tmp_path: Path, *args: str) -> str:
    """``embeddb serve`` on ``host`` bound to its address, port 0; its ``host:port``."""
    ip = net.hosts[host].ip
    port_file = tmp_path / f"{host}.port"
    argv = [sys.executable, "-m", "embeddb.cli", "serve", "--host", ip, "--port", "0"]
    argv += ["--port-file", str(port_file), "--data-dir", str(tmp_path / f"{host}-data"), *args]
    log = tmp_path / f"{host}.log"
    process = net.spawn(host, argv, log)

    def bound() -> str:
        if process.poll() is not None:
            pytest.fail(f"serve on {host} exited with {process.returncode}:\n{log.read_text()}")
        text = port_file.read_text().strip() if port_file.exists() else ""
        return f"{ip}:{text}" if text else ""

    return eventually(bound, START_TIMEOUT_S, f"serve on {host} to write its port file")


def digest(agent: Agent, address: str, timeout_s: float = 3.0) -> dict[str, list[Any]]:
    result: dict[str, list[Any]] = agent.call("digest", addresses=[address], timeout_s=timeout_s)
    return result


def same_rows(agent: Agent, primary: str, follower: str) -> bool:
    """Whether the follower serves exactly the primary's rows, table by table."""
    want = digest(agent, primary)
    return bool(want) and digest(agent, follower) == want


def start_writes(agent: Agent, addresses: list[str], log: Path, base: int, count: int) -> None:
    agent.call(
        "write",
        addresses=addresses,
        table=WRITES_TABLE,
        dim=WRITES_DIM,
        log=str(log),
        count=count,
        batch=BATCH,
        base=base,
        deadline_s=90.0,
        pace_s=0.02,
        timeout_s=2.0,
    )


def assert_acknowledged_writes_served(
    agent: Agent, addresses: list[str], records: list[dict[str, Any]], base: int
) -> int:
    """Every acknowledged write's ids hold its value on the primaries; returns how many."""
    acked = [r["n"] for r in records if r["ok"]]
    ids = [i for n in acked for i in write_ids(n, BATCH, base)]
    vectors = agent.call("lookup", addresses=addresses, table=WRITES_TABLE, ids=ids, timeout_s=10.0)
    lost = [
        (n, i)
        for k, (n, i) in enumerate((n, i) for n in acked for i in write_ids(n, BATCH, base))
        if vectors[k] != [write_value(n)] * WRITES_DIM
    ]
    assert not lost, f"{len(lost)} acknowledged rows lost or changed, e.g. {lost[:5]}"
    return len(acked)


def job_file(tmp_path: Path, addresses: list[str]) -> Path:
    path = tmp_path / "job.yaml"
    doc = {
        "dataset": "adult",
        "model": "builtin:dnn",
        "embedding_config": "preset:adult",
        "mode": "hybrid",
        "epochs": 1,
        "batch_size": 256,
        "workers": 1,
        "addresses": addresses,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def two_shards(net: Lab, tmp_path: Path, *more: str) -> tuple[str, str]:
    """Hosts s0, s1 (shards 0 and 1 of 2, serving :func:`shards_config`), cl (the client, on a
    2 Mbit/s link: training lasts seconds, not a fraction of one, on an idle machine too) and
    ``more``; the shards' addresses."""
    for host in ("s0", "s1", "cl", *more):
        net.add_host(host)
    net.shape("cl", "2mbit")
    config = shards_config(tmp_path / "shards.yaml")
    s0 = serve(net, "s0", tmp_path, "--config", str(config), "--num-shards", "2")
    s1 = serve(net, "s1", tmp_path, "--config", str(config), "--num-shards", "2",
               "--shard-index", "1")  # fmt: skip
    return s0, s1


def start_training(
    net: Lab, agent: Agent, tmp_path: Path, addresses: list[str], log: Path
) -> subprocess.Popen[bytes]:
    """``embeddb train`` on host cl; returns once shard 0 has served its first lookups."""
    job = job_file(tmp_path, addresses)
    train = net.spawn("cl", [sys.executable, "-m", "embeddb", "train", str(job)], log)

    def reached_shard_0() -> bool:
        if train.poll() is not None:
            pytest.fail(f"train exited with {train.returncode}:\n{log.read_text()}")
        stats = agent.call("stats", addresses=[addresses[0]], timeout_s=3.0)[0]["tables"]
        return bool(stats["workclass"]["lookup_ids"] > 0)

    eventually(reached_shard_0, TRAIN_TIMEOUT_S, "the training job's first lookups")
    return train


def test_cut_links_lose_no_acknowledged_write_and_followers_and_training_resume(
    net: Lab, tmp_path: Path
) -> None:
    s0, s1 = two_shards(net, tmp_path, "f0")
    f0 = serve(net, "f0", tmp_path, "--follow", s0)
    agent = start_agent(net, "cl", tmp_path / "agent.log")
    primaries = [s0, s1]
    timings: dict[str, float] = {}

    # 1. The follower's link is cut while the client writes: every write is acknowledged (the
    #    primaries do not wait for followers), and the follower catches up after the heal.
    eventually(lambda: same_rows(agent, s0, f0), 60, "the follower to bootstrap")
    net.cut("f0")
    writes1 = tmp_path / "writes1.jsonl"
    start_writes(agent, primaries, writes1, base=1 << 40, count=50)
    eventually(lambda: len(read_writes(writes1)) == 50, 60, "the 50 writes")
    records1 = read_writes(writes1)
    assert all(r["ok"] for r in records1), [r["error"] for r in records1 if not r["ok"]][:3]
    with pytest.raises(RuntimeError, match=rf"shard 0 \({re.escape(f0)}\).*DEADLINE_EXCEEDED"):
        digest(agent, f0, timeout_s=1.0)  # the cut is real: the follower is unreachable
    healed = time.monotonic()
    net.heal("f0")
    eventually(lambda: same_rows(agent, s0, f0), 60, "the follower to catch up after the heal")
    timings["follower catch-up after a cut (s)"] = time.monotonic() - healed
    assert agent.call("write_stop")

    # 2. Shard 0's link is cut while a training job and the writer run: training waits
    #    (retries naming shard 0), writes to shard 0 fail naming it, and after the heal the
    #    job finishes, no acknowledged write is lost and the follower catches up again.
    train_log = tmp_path / "train.log"
    started = time.monotonic()
    train = start_training(net, agent, tmp_path, primaries, train_log)
    timings["training start-up (s)"] = time.monotonic() - started
    writes2 = tmp_path / "writes2.jsonl"
    start_writes(agent, primaries, writes2, base=2 << 40, count=4000)
    eventually(lambda: any(r["ok"] for r in read_writes(writes2)), 30, "a write before the cut")
    cut = time.monotonic()
    net.cut("s0")
    retry = re.compile(rf"failed \(\w+: shard 0 \({re.escape(s0)}\).*; retry \d+/\d+")

    def waiting_for_shard_0() -> bool:
        if train.poll() is not None:
            pytest.fail(f"train exited during the cut ({train.returncode}):\n"
                        f"{train_log.read_text()}")  # fmt: skip
        return bool(retry.search(train_log.read_text()))

    eventually(waiting_for_shard_0, 40, "the training job to retry its call to shard 0")
    timings["cut until training retried shard 0 (s)"] = time.monotonic() - cut

    def failed_write_naming_shard_0() -> bool:
        failed = [r for r in read_writes(writes2) if not r["ok"]]
        return any(f"shard 0 ({s0})" in r["error"] for r in failed)

    eventually(failed_write_naming_shard_0, 20, "a write failing on the cut shard 0")
    healed = time.monotonic()
    net.heal("s0")
    timings["cut length (s)"] = healed - cut
    code = train.wait(timeout=TRAIN_TIMEOUT_S)
    output = train_log.read_text()
    assert code == 0, output
    assert "test AUC" in output, output
    timings["heal until the job finished (s)"] = time.monotonic() - healed
    assert agent.call("write_stop")
    records2 = read_writes(writes2)
    failures = [r["error"] for r in records2 if not r["ok"]]
    assert failures and all(f"shard 0 ({s0})" in e for e in failures), failures[:3]
    acked = assert_acknowledged_writes_served(agent, primaries, records1, 1 << 40)
    acked += assert_acknowledged_writes_served(agent, primaries, records2, 2 << 40)
    caught = time.monotonic()
    eventually(lambda: same_rows(agent, s0, f0), 60, "the follower to catch up after shard 0's cut")
    timings["follower equal to shard 0 after training (s)"] = time.monotonic() - caught
    timings["writes acknowledged"] = acked
    timings["writes failed during the cut"] = len(failures)
    print("partition timings:", {k: round(v, 2) for k, v in timings.items()})


def test_a_shard_cut_past_the_retries_fails_the_job_naming_the_shard(
    net: Lab, tmp_path: Path
) -> None:
    """A shard that stays unreachable longer than the embedding worker's retries (4 calls of
    10 s) is a crash of the attempt; a job without ``checkpoint_dir`` has no restart, so it ends
    with one ``Error:`` line naming the shard and its address, and leaves no process behind."""
    s0, s1 = two_shards(net, tmp_path)
    agent = start_agent(net, "cl", tmp_path / "agent.log")
    log = tmp_path / "train.log"
    train = start_training(net, agent, tmp_path, [s0, s1], log)
    cut = time.monotonic()
    net.cut("s0")
    code = train.wait(timeout=TRAIN_TIMEOUT_S)
    failed_after = time.monotonic() - cut
    output = log.read_text()
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert code == 1, output
    assert len(errors) == 1, output
    assert "the NN workers failed" in errors[0] and f"shard 0 ({s0})" in errors[0], errors
    assert re.search(rf"failed \(\w+: shard 0 \({re.escape(s0)}\).*; retry 3/3", output), output
    eventually(lambda: net.pids("cl") == [agent.pid], 30, "every process of the job to be gone")
    print(f"cut shard: the job failed {failed_after:.1f} s after the cut: {errors[0]}")
