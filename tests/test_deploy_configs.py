"""The deployment's mounted configs, Grafana dashboard, health checks and shard index, checked
statically (see ``test_deploy.py``)."""

from __future__ import annotations

import importlib.util
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from embeddb.cli import main
from embeddb.config import EmbeddingConfig
from embeddb.engine.shard import Shard
from embeddb.server import ServerConfig, build_server
from embeddb.server.follower import Follower, FollowerOptions
from embeddb.server.metrics import FollowerCollector
from embeddb.trainer.embedding.metrics import WorkerMetrics
from embeddb.transport.rpc import ListenConfig
from tests.deploy_support import (
    DASHBOARD,
    DOCKER,
    PRESETS,
    check_job,
    compose_services,
    image_copies,
    k8s_object,
    map_path,
)


def test_mounted_embedding_configs_load_and_match_the_jobs_dataset() -> None:
    docker = EmbeddingConfig.from_yaml(DOCKER / "config" / "embedding.yaml")
    assert docker == EmbeddingConfig.from_yaml(PRESETS / "adult.yaml")
    configmap = k8s_object("ConfigMap", "embeddb-config")["data"]
    k8s = EmbeddingConfig.from_yaml_text(configmap["embedding.yaml"], source="configmap")
    assert k8s == docker


def test_compose_job_loads_with_our_loader(tmp_path: Path, tokens_env: dict[str, str]) -> None:
    trainer = compose_services()["trainer"]
    mounts = {**image_copies(DOCKER / "Dockerfile.trainer"), **trainer.mounts(tmp_path, tokens_env)}
    job = check_job(mounts["/etc/embeddb/job.yaml"], mounts, tmp_path)
    assert str(job.export_dir) == "/models/adult"
    assert any(str(job.checkpoint_dir).startswith(t + "/") for t in trainer.named_volumes())


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_grafana_provisioning_finds_the_dashboard_and_datasource() -> None:
    grafana = compose_services()["grafana"]
    binds = grafana.binds()
    provisioning = binds["/etc/grafana/provisioning"]
    provider = yaml.safe_load((provisioning / "dashboards" / "embeddb.yaml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert binds[path] == DASHBOARD.parent
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    assert datasource["datasources"][0]["type"] == "prometheus"  # what $datasource lists
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 10
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
    home = grafana.spec["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(map_path(home, binds)) == DASHBOARD
    # Every bind mount of every service exists.
    for service in compose_services().values():
        for target, source in service.binds().items():
            assert source.exists(), f"{service.name}: {source} -> {target}"


def series_names(families: Any) -> set[str]:
    """The series names a set of metric families can produce (counters' ``_total``,
    histograms' ``_bucket``/``_sum``/``_count``), whether or not a child exists yet."""
    names = set()
    for family in families:
        if family.type == "counter":
            names |= {family.name + "_total"}
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def scraped_series(port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return series_names(text_string_to_metric_families(reply.read().decode()))


@pytest.fixture
def exported_metrics(tmp_path: Path) -> Iterator[set[str]]:
    """Names scraped from a real shard and a real follower of it, plus the trainer's and the
    model server's registries."""
    config = EmbeddingConfig.from_yaml(DOCKER / "config" / "embedding.yaml")
    shard = Shard(config, tmp_path / "primary")
    primary = build_server(shard, ServerConfig(ListenConfig(metrics_port=0)))
    follower = Follower(
        config, tmp_path / "follower", FollowerOptions(f"127.0.0.1:{primary.port}", backoff=0.02)
    )
    replica = build_server(
        follower.served, ServerConfig(ListenConfig(metrics_port=0)), serving=False
    )
    assert replica.metrics_registry is not None
    replica.metrics_registry.register(FollowerCollector(follower))
    try:
        follower.start(on_ready=lambda: replica.set_serving(True))
        assert follower.wait_ready(10)
        table = next(iter(config.tables))
        shard.lookup(table, [1, 2, 3], train=True)  # table samples exist once rows do
        assert primary.metrics_port is not None and replica.metrics_port is not None
        names = scraped_series(primary.metrics_port) | scraped_series(replica.metrics_port)
    finally:
        replica.stop(grace=0)
        follower.stop()
        primary.stop(grace=0)
        shard.close()
    names |= series_names(WorkerMetrics(4).registry.collect())
    serving = pytest.importorskip("embeddb.serving.metrics")
    names |= series_names(serving.ModelMetrics(CollectorRegistry()).registry.collect())
    yield names


@pytest.mark.slow
def test_every_dashboard_metric_is_exported(exported_metrics: set[str]) -> None:
    assert "embeddb_follower_lag_seq" in exported_metrics  # the follower was scraped
    assert "embeddb_tier_hits_total" in exported_metrics
    used = {
        m
        for expr in dashboard_exprs()
        for m in re.findall(r"\b(?:embeddb|process|python)_[a-z0-9_]+", expr)
    }
    assert used - exported_metrics == set()
    assert "process_resident_memory_bytes" in used  # the process collectors' panels
    # The panels the deployment needs are there.
    for needed in (
        "embeddb_requests_total",
        "embeddb_request_seconds_bucket",
        "embeddb_tier_hits_total",
        "embeddb_evicted_total",
        "embeddb_trainer_staleness",
        "embeddb_follower_lag_seq",
        "embeddb_follower_lag_seconds",
        "embeddb_model_requests_total",
        "embeddb_model_request_seconds_bucket",
    ):
        assert needed in used, needed


def datasource_refs(node: Any) -> Iterator[dict[str, Any]]:
    """Every ``datasource`` object in the dashboard's JSON, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource" and isinstance(value, dict):
                yield value
            yield from datasource_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from datasource_refs(item)


def test_the_dashboard_hard_codes_no_datasource_uid() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    refs = list(datasource_refs(dashboard))
    assert len(refs) > 20  # panels, targets and the query variables
    assert {r.get("uid") for r in refs} == {"${datasource}"}
    provisioned = DOCKER / "config" / "grafana" / "datasources" / "prometheus.yaml"
    uid = yaml.safe_load(provisioned.read_text())["datasources"][0]["uid"]
    assert uid not in DASHBOARD.read_text()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"


GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__all", "__dashboard"}


def test_every_dashboard_variable_used_is_defined_and_the_filters_are_used() -> None:
    text = DASHBOARD.read_text()
    dashboard = json.loads(text)
    defined = {v["name"]: v for v in dashboard["templating"]["list"]}
    # $name, ${name}, ${name:format} and [[name]], minus Grafana's own
    used = set(re.findall(r"\$\{?(\w+)", text)) | set(re.findall(r"\[\[(\w+)", text))
    assert used - GRAFANA_BUILTINS - set(defined) == set()
    assert {"datasource", "job", "shard"} <= set(defined)
    queries = "\n".join([*dashboard_exprs(), *(v.get("definition", "") for v in defined.values())])
    for name in ("job", "shard"):
        variable = defined[name]
        assert variable["multi"] and variable["includeAll"], name
        assert variable["allValue"] == ".*", name  # "All" must match every series' label
        assert variable["datasource"]["uid"] == "${datasource}", name
        # multi-select values are a regex alternation: only =~ matches them
        assert f'=~"${name}"' in queries, name
        assert f'="${name}"' not in queries, name
    exprs = dashboard_exprs()
    assert all('job=~"$job"' in expr for expr in exprs)
    assert sum('instance=~"$shard"' in expr for expr in exprs) >= 10


@pytest.mark.slow
def test_a_misspelt_dashboard_metric_would_be_caught(exported_metrics: set[str]) -> None:
    assert "embeddb_request_total" not in exported_metrics
    assert "embeddb_trainer_staleness_total" not in exported_metrics


def load_healthcheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location("embeddb_healthcheck", DOCKER / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_images_health_check_follows_grpc_health(tmp_path: Path) -> None:
    check = load_healthcheck()
    config = EmbeddingConfig.from_yaml(DOCKER / "config" / "embedding.yaml")
    shard = Shard(config, tmp_path / "shard")
    server = build_server(shard, ServerConfig())
    try:
        assert check.main([f"127.0.0.1:{server.port}"]) == 0
        server.set_serving(False)  # a follower before its bootstrap; a shard shutting down
        assert check.main([f"127.0.0.1:{server.port}"]) == 1
    finally:
        server.stop(grace=0)
        shard.close()
    assert check.main([f"127.0.0.1:{server.port}"]) == 1  # nothing listens
    assert check.main([]) == 2


def test_serve_reads_the_shard_index_from_the_environment() -> None:
    runner = CliRunner()
    result = runner.invoke(
        main, ["serve", "--ephemeral", "--num-shards=2"], env={"EMBEDDB_SHARD_INDEX": "3"}
    )
    assert result.exit_code == 2
    assert "must be less than --num-shards (2), got 3" in result.output
    result = runner.invoke(
        main,
        ["serve", "--ephemeral", "--num-shards=2", "--shard-index=5"],
        env={"EMBEDDB_SHARD_INDEX": "1"},
    )
    assert "got 5" in result.output  # the option wins over the variable
    result = runner.invoke(main, ["serve", "--num-shards=2"], env={"EMBEDDB_SHARD_INDEX": "-1"})
    assert result.exit_code == 2 and "--shard-index" in result.output
