"""Drop-in monitoring: process and Python collectors in every registry, the durability gauges,
the Prometheus alert rules (docker/config/alerts.yml) and their Kubernetes twins
(deploy/k8s/prometheus-rules.yaml, deploy/k8s/monitors.yaml).

The rules are checked against the series a real shard and follower serve over HTTP (the
``exported_metrics`` fixture of ``test_deploy_configs.py``) and, when ``promtool`` is on PATH
(``scripts/install-promtool.sh``), with ``promtool check rules`` and ``promtool test rules``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from embeddb.config import FsyncPolicy
from embeddb.engine.shard import Shard
from embeddb.server import ServerConfig, build_server
from embeddb.server.metrics import ShardMetrics
from embeddb.trainer.embedding.metrics import WorkerMetrics
from embeddb.transport.rpc import ListenConfig
from embeddb.transport.rpc.metrics_http import add_runtime_collectors
from tests.conftest import one_table_config
from tests.deploy_support import DOCKER, K8S, k8s_docs
from tests.test_deploy_configs import exported_metrics  # noqa: F401 (a fixture)

ALERTS = DOCKER / "config" / "alerts.yml"
PROMETHEUS = DOCKER / "config" / "prometheus.yml"
ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ("process_resident_memory_bytes", "process_start_time_seconds", "python_info")


def scrape(port: int) -> dict[str, list[Any]]:
    """Sample name -> samples served at ``http://127.0.0.1:port/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


# --------------------------------------------------------------------------- collectors
@pytest.mark.slow
def test_a_running_shard_serves_process_python_and_durability_metrics(tmp_path: Path) -> None:
    cfg = one_table_config()
    cfg = replace(
        cfg, store=replace(cfg.store, log=replace(cfg.store.log, fsync=FsyncPolicy.NEVER))
    )
    shard = Shard(cfg, tmp_path / "s")
    server = build_server(shard, ServerConfig(ListenConfig(metrics_port=0)))
    try:
        shard.assign("t", np.arange(4, dtype=np.uint64), np.ones((4, 4), np.float32))
        assert server.metrics_port is not None
        samples = scrape(server.metrics_port)
    finally:
        server.stop(grace=0)
        shard.close()
    for name in RUNTIME:
        assert len(samples.get(name, [])) == 1, name
    assert samples["process_resident_memory_bytes"][0].value > 0
    assert samples["python_info"][0].labels["major"] == str(sys.version_info.major)
    assert "python_gc_objects_collected_total" in samples
    assert samples["embeddb_read_only"][0].value == 0
    assert samples["embeddb_log_seq"][0].value == 1
    # fsync: never leaves the record to the kernel's writeback: not yet durable
    assert samples["embeddb_log_durable_seq"][0].value == 0
    (age,) = samples["embeddb_log_unsynced_seconds"]
    assert age.labels == {"fsync": "never"} and age.value >= 0


def test_fsync_always_leaves_nothing_unsynced(tmp_path: Path) -> None:
    cfg = one_table_config()
    cfg = replace(
        cfg, store=replace(cfg.store, log=replace(cfg.store.log, fsync=FsyncPolicy.ALWAYS))
    )
    registry = CollectorRegistry()
    with Shard(cfg, tmp_path / "s") as shard:
        ShardMetrics(registry).watch(shard)
        shard.assign("t", np.arange(4, dtype=np.uint64), np.ones((4, 4), np.float32))
        labels = {"fsync": FsyncPolicy.ALWAYS.value}
        assert registry.get_sample_value("embeddb_log_unsynced_seconds", labels) == 0
        assert registry.get_sample_value("embeddb_log_durable_seq") == 1


@pytest.mark.slow
def test_trainer_side_registries_hold_the_runtime_collectors_once() -> None:
    worker = WorkerMetrics(4).registry
    assert (worker.get_sample_value("process_resident_memory_bytes") or 0) > 0
    assert worker.get_sample_value("process_start_time_seconds") is not None
    infos = [s for f in worker.collect() for s in f.samples if s.name == "python_info"]
    assert len(infos) == 1 and infos[0].value == 1
    serving = pytest.importorskip("embeddb.serving.metrics")
    shared = CollectorRegistry()
    ShardMetrics(shared)
    serving.ModelMetrics(shared)  # a second metric set in the same registry
    add_runtime_collectors(shared)
    names = [s.name for f in shared.collect() for s in f.samples]
    assert names.count("process_resident_memory_bytes") == 1
    assert names.count("python_info") == 1


_READ_ONLY = textwrap.dedent(
    """
    import resource, signal, sys
    import numpy as np
    from dataclasses import replace
    from prometheus_client import CollectorRegistry
    from embeddb.errors import StorageError
    from embeddb.server.metrics import ShardMetrics
    from embeddb.engine.shard import Shard
    from tests.conftest import one_table_config

    cfg = one_table_config(dim=4, capacity=64)
    cfg = replace(cfg, store=replace(cfg.store, log=replace(cfg.store.log, lz4_min_bytes=0)))
    shard = Shard(cfg, sys.argv[1])
    registry = CollectorRegistry()
    ShardMetrics(registry).watch(shard)
    print("before:", float(registry.get_sample_value("embeddb_read_only")))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
    try:
        for k in range(100):
            shard.assign("t", np.arange(8, dtype=np.uint64) + 100 * k, np.ones((8, 4), np.float32))
    except StorageError:
        pass
    print("after:", float(registry.get_sample_value("embeddb_read_only")))
    """
)


@pytest.mark.slow
def test_read_only_mode_is_exported(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _READ_ONLY, str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    ).stdout
    assert "before: 0.0" in out
    assert "after: 1.0" in out


# --------------------------------------------------------------------------- alert rules
_NOT_NAMES = re.compile(
    r'"(?:[^"\\]|\\.)*"'  # strings
    r"|\{[^}]*\}"  # label matchers
    r"|\[[^\]]*\]"  # ranges
    r"|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"  # label lists
)
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions and keywords left out)."""
    bare = _NOT_NAMES.sub(" ", expr)
    names = re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", bare)
    return {n for n in names if n not in _KEYWORDS}


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_the_rule_name_extractor_finds_names_and_only_names() -> None:
    expr = 'sum by (job) (increase(embeddb_x_total{status="DATA_LOSS"}[15m])) > 0 or up == 0'
    assert metric_names(expr) == {"embeddb_x_total", "up"}
    assert metric_names('changes(process_start_time_seconds{job=~"a|b"}[1h]) >= 3') == {
        "process_start_time_seconds"
    }


@pytest.mark.slow
def test_every_alert_names_only_exported_metrics(exported_metrics: set[str]) -> None:  # noqa: F811
    rules = alert_rules()
    alerts = {r["alert"] for r in rules}
    for needed in ("ShardDown", "FollowerLagging", "FsyncSlow", "ReadOnly", "DiskDataLoss"):
        assert f"Embeddb{needed}" in alerts, needed
    assert "EmbeddbRestartLoop" in alerts
    used = {name for rule in rules for name in metric_names(rule["expr"])}
    assert {"embeddb_read_only", "process_start_time_seconds"} <= used
    # `up` is Prometheus's own series for every target; the rest come from the servers
    assert used - {"up"} - exported_metrics == set()
    assert "embeddb_read_onlyy" not in exported_metrics  # a misspelt name would be caught
    jobs = {c["job_name"] for c in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]}
    for rule in rules:
        for job in re.findall(r'job=~?"([^"]+)"', rule["expr"]):
            assert any(re.fullmatch(job, j) for j in jobs), (rule["alert"], job)


def test_prometheus_loads_the_rules_file() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    assert [PROMETHEUS.parent / f for f in config["rule_files"]] == [ALERTS]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not on PATH (scripts/install-promtool.sh installs it)")
    return path


@pytest.mark.slow
def test_promtool_accepts_the_rules_and_the_config(tmp_path: Path) -> None:
    tool = promtool()
    for args in (["check", "rules", str(ALERTS)], ["check", "config", str(PROMETHEUS)]):
        done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "10 rules found" in done.stdout  # check config checked the rules file too
    bad = tmp_path / "bad.yml"
    bad.write_text("groups: [{name: x, rules: [{alert: A, expr: 'rate(up[5m]'}]}]\n")
    failed = subprocess.run([tool, "check", "rules", str(bad)], capture_output=True, timeout=60)
    assert failed.returncode != 0  # the check can fail


_RULE_TESTS = """
rule_files: [{alerts}]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'embeddb_read_only{{job="embeddb-shard",instance="s0"}}'
        values: '0 0 1 1 1 1'
      - series: 'process_start_time_seconds{{job="embeddb-shard",instance="s0"}}'
        values: '100 100 200 300 400 400'
      - series: 'embeddb_log_unsynced_seconds{{job="embeddb-shard",instance="s0",fsync="never"}}'
        values: '0+60x5'
    alert_rule_test:
      - eval_time: 1m
        alertname: EmbeddbReadOnly
        exp_alerts: []
      - eval_time: 5m
        alertname: EmbeddbReadOnly
        exp_alerts:
          - exp_labels: {{severity: critical, job: embeddb-shard, instance: s0}}
            exp_annotations:
              summary: "Shard s0 is read-only: its update log failed"
              description: "{read_only}"
      - eval_time: 5m
        alertname: EmbeddbRestartLoop
        exp_alerts:
          - exp_labels: {{severity: warning, job: embeddb-shard, instance: s0}}
            exp_annotations:
              summary: "embeddb-shard s0 restarted 3 times in 15m"
              description: "{restart}"
      - eval_time: 5m
        alertname: EmbeddbFsyncSlow
        exp_alerts: []
"""


@pytest.mark.slow
def test_promtool_fires_the_alerts_it_should(tmp_path: Path) -> None:
    tool = promtool()
    rules = {r["alert"]: r for r in alert_rules()}
    tests = tmp_path / "tests.yml"
    tests.write_text(
        _RULE_TESTS.format(
            alerts=ALERTS,
            read_only=rules["EmbeddbReadOnly"]["annotations"]["description"],
            restart=rules["EmbeddbRestartLoop"]["annotations"]["description"],
        )
    )
    done = subprocess.run(
        [tool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --------------------------------------------------------------------------- Kubernetes
def test_the_prometheus_rule_carries_the_same_rules() -> None:
    (rule,) = [d for d in k8s_docs() if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_every_metrics_port_has_a_monitor_with_the_compose_job_name() -> None:
    docs = k8s_docs()
    jobs = {c["job_name"] for c in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]}
    monitors = [d for d in docs if d["kind"] in ("ServiceMonitor", "PodMonitor")]
    assert {m["apiVersion"] for m in monitors} == {"monitoring.coreos.com/v1"}
    covered: set[str] = set()
    for monitor in monitors:
        selector = monitor["spec"]["selector"]["matchLabels"]
        endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        (endpoint,) = endpoints
        assert endpoint["port"] == "metrics"
        (job,) = [r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
        assert job in jobs
        covered.add(job)
        if monitor["kind"] == "ServiceMonitor":
            targets = [
                d
                for d in docs
                if d["kind"] == "Service" and selector.items() <= d["metadata"]["labels"].items()
            ]
            assert targets, monitor["metadata"]["name"]
            for service in targets:
                assert "metrics" in {p["name"] for p in service["spec"]["ports"]}
        else:
            pods = [
                d["spec"]["template"]
                for d in docs
                if "template" in d.get("spec", {})
                and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
            ]
            assert pods, monitor["metadata"]["name"]
            for pod in pods:
                ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
                assert "metrics" in ports
    assert covered == jobs  # shards, followers, model server and trainer
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert {"monitors.yaml", "prometheus-rules.yaml"} <= set(kustomization["resources"])
