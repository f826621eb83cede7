"""The deployment files (docker/, deploy/k8s/), checked statically: Docker cannot run here.

Every container command is parsed by our own CLI (click, so an unknown option fails; torchrun's
and ``embeddb.trainer.run``'s parsers for the training pods), with the container paths it names
mapped to the files the deployment mounts there. Ports, addresses and shard counts must agree
across commands, Services, probes and scrape targets; the mounted configs must load with our
loaders; every metric the Grafana dashboard queries must be exported by a real server or by
the registries of the trainer and the model server. Bearer tokens: the env file of
docker/make_secrets.py is generated in tmp and delivered as Compose and Kubernetes would (file
owners and modes included), and every token a command sends must have the right role among the
tokens its server accepts: replica for followers, ro for the model server, rw for the trainer.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import shlex
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from embeddb.cli import main
from embeddb.config import EmbeddingConfig
from embeddb.errors import ConfigError
from embeddb.rpc import ListenConfig
from embeddb.rpc.auth import Role, Tokens
from embeddb.secrets import read_token_file
from embeddb.server import ServerConfig, build_server
from embeddb.server.follower import Follower, FollowerOptions
from embeddb.server.metrics import FollowerCollector
from embeddb.shard import Shard
from embeddb.trainer.job import JobConfig
from embeddb.trainer.worker_metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
K8S = ROOT / "deploy" / "k8s"
COMPOSE = DOCKER / "compose.yaml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "embeddb.json"
PRESETS = ROOT / "embeddb" / "presets"
EMBEDDB_IMAGES = {"embeddb", "embeddb-trainer"}
NUM_SHARDS = 2
IMAGE_UID = "10001"  # USER of both Dockerfiles
TOKEN_MODES = (0o400, 0o600)  # what embeddb.secrets.check_private_file accepts


# ------------------------------------------------------------------------------------ helpers
def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def k8s_docs() -> list[dict[str, Any]]:
    """Every object of deploy/k8s (the kustomization itself excluded)."""
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc["kind"] == "PyTorchJob":
        return doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]  # type: ignore[no-any-return]
    template = doc.get("spec", {}).get("template")
    return None if template is None else template["spec"]


def image_name(image: str) -> str:
    return image.rsplit("/", 1)[-1].split(":", 1)[0]


def option(args: list[str], name: str) -> str:
    """The value of ``--name=VALUE`` or ``--name VALUE`` in ``args`` (the last one)."""
    values = options(args, name)
    assert values, f"{name} missing from {args}"
    return values[-1]


def options(args: list[str], name: str) -> list[str]:
    found = []
    for i, arg in enumerate(args):
        if arg.startswith(name + "="):
            found.append(arg.split("=", 1)[1])
        elif arg == name and i + 1 < len(args):
            found.append(args[i + 1])
    return found


def map_path(value: str, mounts: dict[str, Path]) -> str:
    """``value`` with a container path under a mount point replaced by the local path."""
    for target in sorted(mounts, key=len, reverse=True):
        if value == target or value.startswith(target.rstrip("/") + "/"):
            return str(mounts[target]) + value[len(target.rstrip("/")) :]
    return value


def map_args(args: list[str], mounts: dict[str, Path]) -> list[str]:
    out = []
    for arg in args:
        if arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
            out.append(f"{name}={map_path(value, mounts)}")
        else:
            out.append(map_path(arg, mounts))
    return out


def parse_embeddb(args: list[str], mounts: dict[str, Path]) -> tuple[str, dict[str, Any]]:
    """Parse ``embeddb ARGS`` with the real CLI (paths mapped): the command and its params.

    Raises click's UsageError/BadParameter on an unknown option, a bad value or a path that
    the deployment does not provide (the options' ``exists=True``)."""
    mapped = map_args(args, mounts)
    parent = click.Context(main, info_name="embeddb")
    name, command, rest = main.resolve_command(parent, mapped)
    assert name is not None and command is not None
    ctx = command.make_context(name, rest, parent=parent)
    return name, ctx.params


# ------------------------------------------------------------------------------------- tokens
def load_make_secrets() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_secrets", DOCKER / "make_secrets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``#`` comments and blank lines skipped), as Compose and kustomize
    read them."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


@pytest.fixture
def tokens_env(tmp_path: Path) -> dict[str, str]:
    """The variables of a fresh env file written by ``docker/make_secrets.py`` in tmp."""
    out = tmp_path / "generated" / "tokens.env"
    assert load_make_secrets().main(["--out", str(out)]) == 0
    assert out.stat().st_mode & 0o777 == 0o600
    assert load_make_secrets().main(["--out", str(out)]) == 1  # kept: no silent rotation
    env = read_env_file(out)
    assert set(env) == {"EMBEDDB_RW_TOKEN", "EMBEDDB_RO_TOKEN", "EMBEDDB_REPLICA_TOKEN"}
    assert len(set(env.values())) == 3
    return env


def write_secret(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.write_text(text)
    path.chmod(mode)


@dataclass
class Auth:
    """Who accepts and who sends which token, from the parsed commands of a deployment."""

    accepts: dict[str, Tokens]  # server name -> the tokens it requires of callers
    sends: dict[tuple[str, str], str]  # (client name, server name) -> the token it sends

    def role(self, client: str, server: str) -> Role | None:
        return self.accepts[server].role_of(self.sends[(client, server)])


def accepted_tokens(params: dict[str, Any], env: dict[str, str]) -> Tokens | None:
    """What a ``serve``/``serve-model`` command requires of its callers (None: nothing)."""
    if params["tokens_file"] is not None:
        return Tokens.from_file(params["tokens_file"])
    if params["tokens_from_env"]:
        return Tokens.from_env(environ=env)
    return None


def check_auth(auth: Auth, shards: list[str], followers: list[str], trainers: list[str]) -> None:
    """Every server requires tokens; followers send their primary a replica token and accept
    the primary's ro and replica tokens but never rw (a follower takes no write, so it need not
    hold the token that writes to the primaries); the model server reads followers with an ro
    token and accepts the ro token only; each trainer sends the primaries an rw token."""
    servers = [*shards, *followers, "model-server"]
    assert set(auth.accepts) == set(servers), "a server that requires no token"
    for shard, follower in zip(shards, followers, strict=True):
        assert auth.role(follower, shard) is Role.REPLICA, follower
        primary, replica = auth.accepts[shard], auth.accepts[follower]
        assert (replica.read_only, replica.replica) == (primary.read_only, primary.replica)
        assert primary.read_write and not replica.read_write, follower
        assert auth.role("model-server", follower) is Role.READ_ONLY
    model = auth.accepts["model-server"]
    assert model.read_only and not model.read_write and not model.replica
    assert model.read_only <= auth.accepts[shards[0]].read_only
    for trainer in trainers:
        for shard in shards:
            assert auth.role(trainer, shard) is Role.READ_WRITE, trainer
    for client, server in auth.sends:
        assert server in servers, f"{client} sends a token to {server}, which is not ours"


def local_job(job_path: Path, mounts: dict[str, Path], tmp: Path) -> Path:
    """A copy of a mounted job whose ``token_file`` names the local copy of the container's
    file (every other path of the deployment's jobs is absolute and checked separately)."""
    job = yaml.safe_load(job_path.read_text())
    assert job.get("token_file"), f"{job_path}: the job sends no token"
    assert Path(job["token_file"]).is_absolute()
    job["token_file"] = map_path(job["token_file"], mounts)
    out = tmp / f"{job_path.stem}.local.yaml"
    out.write_text(yaml.safe_dump(job))
    return out


# ------------------------------------------------------------------------------------ compose
@dataclass
class Service:
    name: str
    spec: dict[str, Any]

    @property
    def command(self) -> list[str]:
        command = self.spec["command"]
        return shlex.split(command) if isinstance(command, str) else list(command)

    @property
    def runs_embeddb(self) -> bool:
        return image_name(self.spec.get("image", "")) in EMBEDDB_IMAGES

    def binds(self) -> dict[str, Path]:
        """Container path -> docker/-relative source of each bind mount."""
        out = {}
        for volume in self.spec.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("."):
                out[target] = (DOCKER / source).resolve()
        return out

    def named_volumes(self) -> dict[str, str]:
        """Container path -> named volume."""
        out = {}
        for volume in self.spec.get("volumes", []):
            source, target = volume.split(":")[:2]
            if not source.startswith((".", "/")):
                out[target] = source
        return out

    def mounts(self, tmp: Path, tokens: dict[str, str] | None = None) -> dict[str, Path]:
        """Container path -> local path of the bind mounts, named volumes and, given the env
        file's ``tokens``, the secrets (see :meth:`secret_files`)."""
        out = self.binds()
        for target, volume in self.named_volumes().items():
            out[target] = tmp / "volumes" / volume
            out[target].mkdir(parents=True, exist_ok=True)
        if tokens is not None:
            out.update(self.secret_files(tmp / "secrets" / self.name, tokens))
        return out

    def secrets(self) -> list[dict[str, Any]]:
        """The service's secrets in the long syntax."""
        return [{"source": e} if isinstance(e, str) else e for e in self.spec.get("secrets", [])]

    def secret_files(self, tmp: Path, tokens: dict[str, str]) -> dict[str, Path]:
        """Container path -> a local file as Compose copies an environment-sourced secret into
        the container: the variable's value, with the entry's mode (Compose's default 0444)."""
        declared = load_compose().get("secrets", {})
        out = {}
        for entry in self.secrets():
            secret = declared[entry["source"]]
            assert set(secret) == {"environment"}, (
                f"{entry['source']}: a file secret keeps its host owner and mode (Compose cannot "
                "set them): use an environment-sourced one"
            )
            target = entry.get("target", entry["source"])
            path = target if target.startswith("/") else f"/run/secrets/{target}"
            local = tmp / path.lstrip("/")
            write_secret(local, tokens[secret["environment"]] + "\n", entry.get("mode", 0o444))
            out[path] = local
        return out

    def environment(self, tokens: dict[str, str]) -> dict[str, str]:
        """The container's environment, ``${VAR}`` / ``${VAR:?message}`` interpolated from the
        env file as ``docker compose --env-file`` does (a missing variable fails)."""
        raw = self.spec.get("environment", {})
        assert isinstance(raw, dict), f"{self.name}: environment as a mapping, please"
        return {k: interpolate(str(v), tokens) for k, v in raw.items()}

    def exposed(self) -> set[int]:
        return {int(p) for p in self.spec.get("expose", [])}

    def published(self) -> dict[int, int]:
        """Container port -> host port."""
        out = {}
        for mapping in self.spec.get("ports", []):
            parts = str(mapping).split(":")
            out[int(parts[-1])] = int(parts[-2])
        return out


def interpolate(value: str, variables: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name, required = match.group(1), match.group(2)
        if name not in variables:
            assert required is None, f"${{{name}}} is not set: {required}"
            return ""
        return variables[name]

    return re.sub(r"\$\{(\w+)(?::\?([^}]*))?\}", one, value)


def compose_services() -> dict[str, Service]:
    return {name: Service(name, spec) for name, spec in load_compose()["services"].items()}


def export_model_stub(volume: Path, model: str) -> None:
    """What the trainer leaves in the models volume: serve-model's --model must exist."""
    (volume / model).mkdir(parents=True, exist_ok=True)


def test_compose_commands_are_real_cli_invocations(
    tmp_path: Path, tokens_env: dict[str, str]
) -> None:
    services = compose_services()
    ours = [s for s in services.values() if s.runs_embeddb]
    commands = {}
    for service in ours:
        mounts = service.mounts(tmp_path / service.name, tokens_env)
        if service.command[0] == "serve-model":
            model = Path(option(service.command, "--model"))
            export_model_stub(mounts[str(model.parent)], model.name)
        name, params = parse_embeddb(service.command, mounts)
        commands[service.name] = name
        if name == "serve":
            assert params["shard_index"] < params["num_shards"], service.name
    assert sorted(set(commands.values())) == ["serve", "serve-model", "train"]
    assert {n for n, c in commands.items() if c == "serve"} == {
        *(f"shard-{k}" for k in range(NUM_SHARDS)),
        *(f"follower-{k}" for k in range(NUM_SHARDS)),
    }


def host_of(address: str) -> str:
    return address.rsplit(":", 1)[0]


def client_tokens(
    name: str, command: str, params: dict[str, Any], mounts: dict[str, Path], tmp: Path
) -> dict[str, str]:
    """Server host -> the token the command ``name`` (an ``embeddb`` command, its params
    parsed with container paths mapped) sends it: read with our reader, so a missing or
    group-readable file fails here as it would in the container."""
    if command == "serve" and params["follow"] is not None:
        assert params["primary_token_file"] is not None, f"{name} sends its primary no token"
        return {host_of(params["follow"]): read_token_file(params["primary_token_file"])}
    if command == "serve-model":
        assert params["shard_token_file"] is not None, f"{name} sends the shards no token"
        token = read_token_file(params["shard_token_file"])
        addresses = list(params["shards"])
        if params["address_file"] is not None:
            addresses += params["address_file"].read_text().split()
        return {host_of(a): token for a in addresses}
    if command == "train":
        job = JobConfig.from_yaml(local_job(params["job"], mounts, tmp))
        token = job.read_token()
        assert token is not None and job.addresses is not None, name
        return {host_of(a): token for a in job.addresses}
    return {}


def compose_auth(services: dict[str, Service], tmp: Path, tokens: dict[str, str]) -> Auth:
    """Parse every embeddb command of the stack with its secrets delivered in ``tmp``."""
    auth = Auth({}, {})
    for service in (s for s in services.values() if s.runs_embeddb):
        for entry in service.secrets():
            assert entry.get("uid") == entry.get("gid") == IMAGE_UID, service.name
            assert entry.get("mode") in TOKEN_MODES, service.name
        mounts = service.mounts(tmp / service.name, tokens)
        if service.command[0] == "serve-model":
            model = Path(option(service.command, "--model"))
            export_model_stub(mounts[str(model.parent)], model.name)
        command, params = parse_embeddb(service.command, mounts)
        if command in ("serve", "serve-model"):
            accepted = accepted_tokens(params, service.environment(tokens))
            if accepted is not None:
                auth.accepts[service.name] = accepted
        for host, token in client_tokens(service.name, command, params, mounts, tmp).items():
            auth.sends[(service.name, host)] = token
    return auth


def test_compose_services_require_and_send_tokens_of_the_right_role(
    tmp_path: Path, tokens_env: dict[str, str]
) -> None:
    auth = compose_auth(compose_services(), tmp_path, tokens_env)
    check_auth(
        auth,
        shards=[f"shard-{k}" for k in range(NUM_SHARDS)],
        followers=[f"follower-{k}" for k in range(NUM_SHARDS)],
        trainers=["trainer"],
    )
    # Each service gets the client token it sends and no other.
    secrets = {n: [e["source"] for e in s.secrets()] for n, s in compose_services().items()}
    assert {n: v for n, v in secrets.items() if v} == {
        **{f"follower-{k}": ["replica-token"] for k in range(NUM_SHARDS)},
        "trainer": ["rw-token"],
        "model-server": ["ro-token"],
    }
    text = COMPOSE.read_text()
    assert "make_secrets.py" in text and "--env-file docker/secrets/tokens.env" in text


def test_a_wrong_role_or_a_public_token_file_in_compose_would_fail(
    tmp_path: Path, tokens_env: dict[str, str]
) -> None:
    services = compose_services()
    follower = services["follower-0"]
    # The ro token where the follower's command reads its primary's token:
    follower.spec["secrets"] = [
        {**follower.secrets()[0], "source": "ro-token", "target": "replica-token"}
    ]
    auth = compose_auth(services, tmp_path / "ro", tokens_env)
    assert auth.role("follower-0", "shard-0") is Role.READ_ONLY
    with pytest.raises(AssertionError):
        check_auth(auth, ["shard-0", "shard-1"], ["follower-0", "follower-1"], ["trainer"])
    services = compose_services()
    services["trainer"].spec["secrets"][0]["mode"] = 0o444  # Compose's default mode
    with pytest.raises(AssertionError):
        compose_auth(services, tmp_path / "public", tokens_env)
    services["trainer"].spec["secrets"][0]["mode"] = 0o400
    del services["shard-1"].spec["environment"]  # --tokens-from-env with nothing set
    with pytest.raises(ConfigError, match="EMBEDDB_RW_TOKEN"):
        compose_auth(services, tmp_path / "open", tokens_env)


def test_a_bad_option_in_a_command_would_fail(tmp_path: Path) -> None:
    shard = compose_services()["shard-0"]
    with pytest.raises(click.UsageError):
        parse_embeddb([*shard.command, "--no-such-option"], shard.mounts(tmp_path))
    with pytest.raises(click.BadParameter):  # a config the deployment does not mount
        parse_embeddb(
            [a for a in shard.command if not a.startswith("--config")] + ["--config=/nope.yaml"],
            shard.mounts(tmp_path),
        )


def test_compose_topology_agrees_everywhere() -> None:
    services = compose_services()
    job = yaml.safe_load((DOCKER / "config" / "job.yaml").read_text())
    shards = [services[f"shard-{k}"] for k in range(NUM_SHARDS)]
    followers = [services[f"follower-{k}"] for k in range(NUM_SHARDS)]
    for k, (shard, follower) in enumerate(zip(shards, followers, strict=True)):
        for service in (shard, follower):
            assert option(service.command, "--shard-index") == str(k)
            assert option(service.command, "--num-shards") == str(NUM_SHARDS)
            assert option(service.command, "--host") == "0.0.0.0"
        port = option(shard.command, "--port")
        assert option(follower.command, "--follow") == f"shard-{k}:{port}"
        assert f"shard-{k}" in follower.spec["depends_on"]
        # Rows persist: the data directory lies on the service's own named volume.
        for service in (shard, follower):
            data_dir = option(service.command, "--data-dir")
            volumes = service.named_volumes()
            assert any(data_dir.startswith(t + "/") for t in volumes), service.name
            assert service.name in volumes.values()
    # The trainer writes to the primaries, the model server reads the followers, in shard order.
    assert job["addresses"] == [
        f"shard-{k}:{option(s.command, '--port')}" for k, s in enumerate(shards)
    ]
    server = services["model-server"]
    assert options(server.command, "--shard") == [
        f"follower-{k}:{option(f.command, '--port')}" for k, f in enumerate(followers)
    ]
    # The model the trainer exports is the one served, through one shared volume.
    trainer = services["trainer"]
    export_dir = job["export_dir"]
    assert option(server.command, "--model") == export_dir
    trainer_volume = next(v for t, v in trainer.named_volumes().items() if export_dir.startswith(t))
    server_volume = next(v for t, v in server.named_volumes().items() if export_dir.startswith(t))
    assert trainer_volume == server_volume
    assert server.spec["depends_on"]["trainer"]["condition"] == "service_completed_successfully"
    # Every named volume is declared.
    declared = set(load_compose()["volumes"])
    for service in services.values():
        assert set(service.named_volumes().values()) <= declared, service.name


def dockerfile_healthcheck_port(path: Path) -> int:
    match = re.search(
        r"HEALTHCHECK[^\n]*(?:\\\n[^\n]*)*?(\d+\.\d+\.\d+\.\d+):(\d+)", path.read_text()
    )
    assert match, f"no health check address in {path}"
    return int(match.group(2))


def dockerfile_exposed(path: Path) -> set[int]:
    return {
        int(p)
        for line in re.findall(r"^EXPOSE (.+)$", path.read_text(), re.M)
        for p in line.split()
    }


def test_compose_ports_agree_with_exposed_published_scraped_and_health_checked() -> None:
    services = compose_services()
    prometheus = yaml.safe_load((DOCKER / "config" / "prometheus.yml").read_text())
    targets = {
        t
        for job in prometheus["scrape_configs"]
        for sc in job["static_configs"]
        for t in sc["targets"]
    }
    metrics_targets = set()
    for service in (s for s in services.values() if s.runs_embeddb):
        ports = (
            [int(option(service.command, "--port"))] if options(service.command, "--port") else []
        )
        if options(service.command, "--http-port"):
            ports.append(int(option(service.command, "--http-port")))
        if options(service.command, "--metrics-port"):
            metrics = int(option(service.command, "--metrics-port"))
            ports.append(metrics)
            metrics_targets.add(f"{service.name}:{metrics}")
        if service.command[:1] == ["train"]:  # the job's metrics_port: the embedding worker's
            assert service.command[1] == "/etc/embeddb/job.yaml"
            job = yaml.safe_load((DOCKER / "config" / "job.yaml").read_text())
            assert job["workers"] == 1  # ranks serve on metrics_port + local rank
            ports.append(int(job["metrics_port"]))
            metrics_targets.add(f"{service.name}:{job['metrics_port']}")
        assert set(ports) <= service.exposed(), service.name
        assert set(service.published()) <= set(ports), service.name
        build = service.spec["build"]
        assert build["context"] == ".."
        assert set(ports) <= dockerfile_exposed(ROOT / build["dockerfile"]), service.name
    # Every metrics port is scraped, and nothing else.
    assert targets == metrics_targets
    # Published host ports do not collide.
    host_ports = [p for s in services.values() for p in s.published().values()]
    assert len(host_ports) == len(set(host_ports))
    # The server image's health check dials the port the shards and followers serve on.
    health = dockerfile_healthcheck_port(DOCKER / "Dockerfile")
    for k in range(NUM_SHARDS):
        for name in (f"shard-{k}", f"follower-{k}"):
            assert int(option(services[name].command, "--port")) == health
            assert "healthcheck" not in services[name].spec  # the image's applies
    server = services["model-server"]
    address = server.spec["healthcheck"]["test"][-1]
    assert address == f"127.0.0.1:{option(server.command, '--port')}"
    assert 3000 in services["grafana"].published()
    datasources = DOCKER / "config" / "grafana" / "datasources" / "prometheus.yaml"
    assert "prometheus:9090" in datasources.read_text()
    assert 9090 in services["prometheus"].published()


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(relative: str) -> bool:
    for pattern in dockerignore_patterns():
        bare = pattern.removeprefix("**/")
        if fnmatch.fnmatch(relative, pattern) or relative.split("/")[0] == pattern.rstrip("/"):
            return True
        if pattern.startswith("**/") and fnmatch.fnmatch(relative.rsplit("/", 1)[-1], bare):
            return True
    return False


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.trainer"])
def test_dockerfile_copy_sources_exist_and_are_in_the_build_context(dockerfile: str) -> None:
    text = (DOCKER / dockerfile).read_text()
    copies = [line.split()[:-1] for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M)]
    sources = [s for line in copies for s in line]
    assert "pyproject.toml" in sources and "embeddb" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not ignored(source), f"{source} is excluded by .dockerignore"
    assert re.search(r"^USER (?!root|0\b)\S+", text, re.M), "the image must not run as root"
    assert re.search(r'^ENTRYPOINT \["embeddb"\]', text, re.M)
    # Every package pyproject installs is copied: all live under embeddb/ (the top-level client/
    # and trainer/ are links into it, which COPY would copy as dangling links).
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["package-dir"] == {"": "."}
    assert all(p.split(".")[0] == "embeddb" for p in project["tool"]["setuptools"]["packages"])
    assert not {"client", "trainer"} & set(sources)
    assert project["project"]["readme"] in sources


def test_the_server_images_default_command_is_real(tmp_path: Path) -> None:
    text = (DOCKER / "Dockerfile").read_text()
    match = re.search(r"^CMD (\[.*?\])\s*$", text, re.M | re.S)
    assert match
    args = json.loads(match.group(1).replace("\\\n", ""))
    name, params = parse_embeddb(args, {})
    assert name == "serve" and params["port"] == dockerfile_healthcheck_port(DOCKER / "Dockerfile")
    assert params["metrics_port"] in dockerfile_exposed(DOCKER / "Dockerfile")


def test_trainer_image_torch_index_is_a_build_arg_and_the_pin_is_pyprojects() -> None:
    text = (DOCKER / "Dockerfile.trainer").read_text()
    assert re.search(r"^ARG TORCH_INDEX_URL=https://download\.pytorch\.org/whl/cpu$", text, re.M)
    assert 'optional-dependencies"]["trainer"]' in text  # the pin is read, not repeated
    readme = (DOCKER / "README.md").read_text()
    assert "TORCH_INDEX_URL" in readme and "cu1" in readme


# ---------------------------------------------------------------------------- mounted configs
def test_mounted_embedding_configs_load_and_match_the_jobs_dataset() -> None:
    docker = EmbeddingConfig.from_yaml(DOCKER / "config" / "embedding.yaml")
    assert docker == EmbeddingConfig.from_yaml(PRESETS / "adult.yaml")
    configmap = k8s_object("ConfigMap", "embeddb-config")["data"]
    k8s = EmbeddingConfig.from_yaml_text(configmap["embedding.yaml"], source="configmap")
    assert k8s == docker


def check_job(job_path: Path, mounts: dict[str, Path], tmp: Path) -> JobConfig:
    """Load a mounted job with our loader (its ``token_file`` the local copy of the mounted
    secret) and check what a container would resolve."""
    job = JobConfig.from_yaml(local_job(job_path, mounts, tmp))
    assert job.read_token() is not None
    assert job.missing_data() is None  # adult: the packaged copy
    # The shards' own mounted file (job.embedding_config_path() would look on this machine).
    assert Path(job.embedding_config).is_absolute()
    embedding = Path(map_path(job.embedding_config, mounts))
    assert EmbeddingConfig.from_yaml(embedding) == EmbeddingConfig.from_yaml(PRESETS / "adult.yaml")
    model_file, model_name = job.model.rsplit(":", 1)
    local = Path(map_path(model_file, mounts))
    assert local.is_file(), local
    assert re.search(rf"^class {model_name}\b", local.read_text(), re.M)
    assert job.export_dir is not None and job.checkpoint_dir is not None
    return job


def image_copies(dockerfile: Path) -> dict[str, Path]:
    """Container path -> repository path of each ``COPY SRC DEST`` of a directory."""
    out = {}
    for src, dest in re.findall(r"^COPY (?!--from)(\S+) (/\S+)$", dockerfile.read_text(), re.M):
        out[dest] = ROOT / src
    return out


def test_compose_job_loads_with_our_loader(tmp_path: Path, tokens_env: dict[str, str]) -> None:
    trainer = compose_services()["trainer"]
    mounts = {**image_copies(DOCKER / "Dockerfile.trainer"), **trainer.mounts(tmp_path, tokens_env)}
    job = check_job(mounts["/etc/embeddb/job.yaml"], mounts, tmp_path)
    assert str(job.export_dir) == "/models/adult"
    assert any(str(job.checkpoint_dir).startswith(t + "/") for t in trainer.named_volumes())


# ------------------------------------------------------------------------------------ grafana
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
    uid = datasource["datasources"][0]["uid"]
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 10
    for panel in panels:
        assert panel["datasource"]["uid"] == uid, panel["title"]
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
    serving = pytest.importorskip("embeddb.trainer.serving.metrics")
    names |= series_names(serving.ModelMetrics(CollectorRegistry()).registry.collect())
    yield names


def test_every_dashboard_metric_is_exported(exported_metrics: set[str]) -> None:
    assert "embeddb_follower_lag_seq" in exported_metrics  # the follower was scraped
    assert "embeddb_tier_hits_total" in exported_metrics
    used = {m for expr in dashboard_exprs() for m in re.findall(r"\bembeddb_[a-z0-9_]+", expr)}
    assert used - exported_metrics == set()
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


def test_a_misspelt_dashboard_metric_would_be_caught(exported_metrics: set[str]) -> None:
    assert "embeddb_request_total" not in exported_metrics
    assert "embeddb_trainer_staleness_total" not in exported_metrics


# ------------------------------------------------------------------------------------- health
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


# ----------------------------------------------------------------------------- shard index env
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


# ---------------------------------------------------------------------------------- kubernetes
def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    manifests = {
        p.name
        for p in K8S.glob("*.yaml")
        if p.name != "kustomization.yaml" and not p.name.endswith(".example.yaml")
    }
    assert set(kustomization["resources"]) == manifests
    images = {i["name"] for i in kustomization["images"]}
    used = {
        image_name(c["image"])
        for d in k8s_docs()
        if d["kind"] != "PyTorchJob" and (spec := pod_spec(d)) is not None
        for c in spec["containers"]
    }
    assert used == images == EMBEDDB_IMAGES


SECRET = "embeddb-tokens"  # kustomization.yaml's secretGenerator


def pod_mounts(
    spec: dict[str, Any],
    container: dict[str, Any],
    tmp: Path,
    tokens: dict[str, str] | None = None,
) -> dict[str, Path]:
    """Container path -> a local directory holding what the volume would (one directory per
    volume, shared by the pod's containers). A Secret volume holds the ``tokens`` (the env
    file's variables, the generated Secret's keys) with the modes kubelet gives them: the
    item's ``mode`` or ``defaultMode`` (0644 if unset), made group-readable (``| 0440``) when
    the pod sets ``fsGroup`` (kubernetes/kubernetes#57923)."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    out = {}
    for mount in container.get("volumeMounts", []):
        local = tmp / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        volume = volumes.get(mount["name"], {})
        if "configMap" in volume:
            data = k8s_object("ConfigMap", volume["configMap"]["name"])["data"]
            for key, text in data.items():
                (local / key).write_text(text)
        if "secret" in volume:
            source = volume["secret"]
            assert tokens is not None and source["secretName"] == SECRET, mount["name"]
            items = source.get("items") or [{"key": k, "path": k} for k in tokens]
            for item in items:
                mode = item.get("mode", source.get("defaultMode", 0o644))
                if spec.get("securityContext", {}).get("fsGroup") is not None:
                    mode |= 0o440
                write_secret(local / item["path"], tokens[item["key"]], mode)
        out[mount["mountPath"]] = local
    return out


def run_init_containers(spec: dict[str, Any], tmp: Path, tokens: dict[str, str]) -> None:
    """Do what the pod's init containers do; the only one allowed copies token files into a
    volume of the pod: ``install -m MODE FILE... DIR/`` (owned by the pod's user)."""
    for init in spec.get("initContainers", []):
        command = init["command"]
        assert command[:2] == ["install", "-m"] and len(command) >= 5, init["name"]
        assert image_name(init["image"]) in EMBEDDB_IMAGES, init["name"]
        mounts = pod_mounts(spec, init, tmp, tokens)
        target = Path(map_path(command[-1], mounts))
        assert target.is_dir(), f"{init['name']}: {command[-1]} is no volume of the pod"
        for source in command[3:-1]:
            local = Path(map_path(source, mounts))
            write_secret(target / local.name, local.read_text(), int(command[2], 8))


def container_env(container: dict[str, Any], tokens: dict[str, str]) -> dict[str, str]:
    """The container's variables set by value or from the Secret (``secretKeyRef``)."""
    out = {}
    for entry in container.get("env", []):
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            assert ref["name"] == SECRET, entry["name"]
            out[entry["name"]] = tokens[ref["key"]]
        elif "value" in entry:
            out[entry["name"]] = entry["value"]
    return out


def expand(args: list[str], container: dict[str, Any], sample: str = "0") -> list[str]:
    """Kubernetes' ``$(VAR)`` expansion; a variable set from a field gets ``sample``."""
    env = {e["name"]: e.get("value", sample) for e in container.get("env", [])}
    out = []
    for arg in args:
        for name, value in env.items():
            arg = arg.replace(f"$({name})", value)
        assert "$(" not in arg, f"undefined variable in {arg}"
        out.append(arg)
    return out


def k8s_containers(
    docs: list[dict[str, Any]] | None = None,
) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    out = []
    for doc in k8s_docs() if docs is None else docs:
        spec = pod_spec(doc)
        if spec is not None:
            out += [(doc, spec, c) for c in spec["containers"]]
    return out


def parse_trainer_run(args: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[JobConfig, Path]:
    """Run ``python -m embeddb.trainer.run ARGS`` up to the training itself."""
    run = pytest.importorskip("embeddb.trainer.run")
    seen: list[tuple[JobConfig, Path]] = []
    monkeypatch.setattr(
        run, "train", lambda job, addresses, predict, **_: seen.append((job, addresses))
    )
    assert run.main(args) == 0
    return seen[0]


def test_every_k8s_container_runs_a_real_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokens_env: dict[str, str]
) -> None:
    torchrun = pytest.importorskip("torch.distributed.run")
    ran = []
    for i, (doc, spec, container) in enumerate(k8s_containers()):
        run_init_containers(spec, tmp_path / str(i), tokens_env)
        mounts = pod_mounts(spec, container, tmp_path / str(i), tokens_env)
        args = expand(container.get("args", []), container)
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if container.get("command") == ["python", "-m", "torch.distributed.run"]:
            parsed = torchrun.get_args_parser().parse_args(args)
            assert parsed.module and parsed.training_script == "embeddb.trainer.run", where
            mounts.update(image_copies(DOCKER / "Dockerfile.trainer"))
            script = map_args(parsed.training_script_args, mounts)
            script[0] = str(local_job(Path(script[0]), mounts, tmp_path / str(i)))
            job, addresses = parse_trainer_run(script, monkeypatch)
            check_job(Path(script[0]), mounts, tmp_path / str(i))
            assert [a.strip() for a in addresses.read_text().splitlines()] == list(
                job.addresses or ()
            )
            ran.append("torchrun")
            continue
        assert "command" not in container, f"{where}: the image's entrypoint is embeddb"
        if args[0] == "serve-model":
            model = Path(option(args, "--model"))
            export_model_stub(mounts[str(model.parent)], model.name)
        name, _ = parse_embeddb(args, mounts)
        ran.append(name)
    assert sorted(set(ran)) == ["serve", "serve-model", "torchrun"]


def k8s_auth(docs: list[dict[str, Any]], tmp: Path, tokens: dict[str, str]) -> Auth:
    """Every container of ``docs`` parsed with its volumes, init containers and Secret
    variables in ``tmp``. Servers are named by the host their callers dial (the model server:
    ``model-server``), clients by their Deployment (followers: their Service's host), and the
    trainers ``KIND/NAME``."""
    torchrun = pytest.importorskip("torch.distributed.run")
    auth = Auth({}, {})
    for i, (doc, spec, container) in enumerate(k8s_containers(docs)):
        local = tmp / str(i)
        run_init_containers(spec, local, tokens)
        mounts = pod_mounts(spec, container, local, tokens)
        args = expand(container.get("args", []), container)
        if container.get("command") == ["python", "-m", "torch.distributed.run"]:
            script = map_args(
                torchrun.get_args_parser().parse_args(args).training_script_args, mounts
            )
            job = JobConfig.from_yaml(local_job(Path(script[0]), mounts, local))
            token = job.read_token()
            assert token is not None
            for address in Path(option(script, "--addresses")).read_text().split():
                auth.sends[(f"{doc['kind']}/{doc['metadata']['name']}", host_of(address))] = token
            continue
        if args[0] == "serve-model":
            model = Path(option(args, "--model"))
            export_model_stub(mounts[str(model.parent)], model.name)
        command, params = parse_embeddb(args, mounts)
        if doc["kind"] == "StatefulSet":
            names = [
                f"{doc['metadata']['name']}-{k}.{doc['spec']['serviceName']}"
                for k in range(doc["spec"]["replicas"])
            ]
        else:
            names = ["model-server" if command == "serve-model" else doc["metadata"]["name"]]
        accepted = accepted_tokens(params, container_env(container, tokens))
        for name in names:
            if accepted is not None:
                auth.accepts[name] = accepted
            for host, token in client_tokens(name, command, params, mounts, local).items():
                auth.sends[(name, host)] = token
    return auth


def check_k8s_auth(auth: Auth) -> None:
    check_auth(
        auth,
        shards=[f"embeddb-shard-{k}.embeddb-shard" for k in range(NUM_SHARDS)],
        followers=[f"embeddb-follower-{k}" for k in range(NUM_SHARDS)],
        trainers=["Job/embeddb-trainer", "PyTorchJob/embeddb-trainer"],
    )


def test_k8s_pods_require_and_send_tokens_of_the_right_role(
    tmp_path: Path, tokens_env: dict[str, str]
) -> None:
    check_k8s_auth(k8s_auth(k8s_docs(), tmp_path, tokens_env))
    # The Secret is generated from make_secrets.py's env file (never committed) under a fixed
    # name (pytorchjob.example.yaml is applied on its own).
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["secretGenerator"] == [{"name": SECRET, "envs": ["secrets/tokens.env"]}]
    assert kustomization["generatorOptions"]["disableNameSuffixHash"] is True
    assert "*" in (K8S / "secrets" / ".gitignore").read_text().split()
    assert "*" in (DOCKER / "secrets" / ".gitignore").read_text().split()
    assert not [d for d in k8s_docs() if d["kind"] == "Secret"]  # no token committed
    # Each pod's Secret volume holds the one key it needs, private by defaultMode.
    needs = {
        "embeddb-follower-0": "EMBEDDB_REPLICA_TOKEN",
        "embeddb-follower-1": "EMBEDDB_REPLICA_TOKEN",
        "embeddb-model-server": "EMBEDDB_RO_TOKEN",
        "embeddb-trainer": "EMBEDDB_RW_TOKEN",
    }
    for doc, spec, _ in k8s_containers():
        secrets = [v["secret"] for v in spec.get("volumes", []) if "secret" in v]
        assert len(secrets) == (doc["metadata"]["name"] in needs), doc["metadata"]["name"]
        for secret in secrets:
            assert secret["defaultMode"] in TOKEN_MODES
            assert [i["key"] for i in secret["items"]] == [needs[doc["metadata"]["name"]]]


def test_a_token_file_read_straight_from_a_k8s_secret_would_be_refused(
    tmp_path: Path, tokens_env: dict[str, str]
) -> None:
    """With ``fsGroup`` kubelet makes a Secret's files 0440 whatever ``defaultMode`` says, and
    embeddb refuses a token file group may read: hence the init containers' private copies."""
    docs = k8s_docs()
    follower = next(
        d
        for d in docs
        if d["metadata"]["name"] == "embeddb-follower-0" and d["kind"] == "Deployment"
    )
    pod = follower["spec"]["template"]["spec"]
    container = pod["containers"][0]
    container["volumeMounts"].append({"name": "token-secret", "mountPath": "/secrets/t"})
    container["args"] = [
        "--primary-token-file=/secrets/t/replica-token" if a.startswith("--primary-token") else a
        for a in container["args"]
    ]
    with pytest.raises(ConfigError, match="chmod 600"):
        k8s_auth(docs, tmp_path / "secret", tokens_env)
    # Only fsGroup makes it fail here: without it the file keeps 0400 (but is root's, so
    # unreadable by uid 10001: a static check cannot see that).
    del pod["securityContext"]["fsGroup"]
    check_k8s_auth(k8s_auth(docs, tmp_path / "no-fsgroup", tokens_env))
    docs = k8s_docs()
    server = next(
        d
        for d in docs
        if d["metadata"]["name"] == "embeddb-model-server" and d["kind"] == "Deployment"
    )
    volumes = {v["name"]: v for v in server["spec"]["template"]["spec"]["volumes"]}
    volumes["token-secret"]["secret"]["items"][0]["key"] = "EMBEDDB_RW_TOKEN"  # not ro
    with pytest.raises(AssertionError):
        check_k8s_auth(k8s_auth(docs, tmp_path / "rw", tokens_env))


def named_ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def probe_port(probe: dict[str, Any], ports: dict[str, int]) -> int:
    for kind in ("grpc", "httpGet", "tcpSocket"):
        if kind in probe:
            port = probe[kind]["port"]
            return ports[port] if isinstance(port, str) else int(port)
    raise AssertionError(f"no port in probe {probe}")


def test_k8s_ports_probes_and_services_agree() -> None:
    services = [d for d in k8s_docs() if d["kind"] == "Service"]
    for doc, _, container in k8s_containers():
        if doc["kind"] == "PyTorchJob":
            continue
        ports = named_ports(container)
        args = container.get("args", [])
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        if args and args[0] in ("serve", "serve-model"):
            assert ports["grpc"] == int(option(args, "--port")), where
            assert ports["metrics"] == int(option(args, "--metrics-port")), where
            assert option(args, "--host") == "0.0.0.0", where
            annotations = doc["spec"]["template"]["metadata"]["annotations"]
            assert annotations["prometheus.io/port"] == str(ports["metrics"]), where
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert probe_port(container[probe], ports) in ports.values(), f"{where} {probe}"
            assert probe_port(container["readinessProbe"], ports) != ports["metrics"], where
            assert container["resources"]["requests"], where
        if args and args[0] == "serve-model":
            assert ports["http"] == int(option(args, "--http-port")), where
        labels = doc["spec"]["template"]["metadata"]["labels"]
        selecting = [s for s in services if s["spec"]["selector"].items() <= labels.items()]
        assert selecting, f"no Service selects {where}"
        for service in selecting:
            for port in service["spec"]["ports"]:
                target = port["targetPort"]
                assert target in ports, f"{service['metadata']['name']}: {target} not in {where}"
                assert port["port"] == ports[target]


def test_k8s_shards_followers_and_addresses_agree() -> None:
    statefulset = k8s_object("StatefulSet", "embeddb-shard")
    headless = k8s_object("Service", statefulset["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    replicas = statefulset["spec"]["replicas"]
    assert replicas == NUM_SHARDS
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert option(args, "--num-shards") == str(replicas)
    assert "--shard-index" not in " ".join(args)  # from the pod ordinal, below
    env = {e["name"]: e for e in container["env"]}
    field = env["EMBEDDB_SHARD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert field == "metadata.labels['apps.kubernetes.io/pod-index']"
    claim = statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == claim)
    assert option(args, "--data-dir").startswith(mount["mountPath"] + "/")
    port = int(option(args, "--port"))
    primaries = [
        f"embeddb-shard-{k}.{headless['metadata']['name']}:{port}" for k in range(replicas)
    ]

    data = k8s_object("ConfigMap", "embeddb-config")["data"]
    assert data["shards.txt"].split() == primaries
    assert yaml.safe_load(data["job.yaml"])["addresses"] == primaries
    follower_addresses = []
    for k in range(replicas):
        follower = k8s_object("Deployment", f"embeddb-follower-{k}")
        fargs = follower["spec"]["template"]["spec"]["containers"][0]["args"]
        assert option(fargs, "--follow") == primaries[k]
        assert option(fargs, "--shard-index") == str(k)
        assert option(fargs, "--num-shards") == str(replicas)
        service = k8s_object("Service", f"embeddb-follower-{k}")
        assert (
            service["spec"]["selector"].items()
            <= follower["spec"]["template"]["metadata"]["labels"].items()
        )
        grpc_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
        follower_addresses.append(f"embeddb-follower-{k}:{grpc_port}")
    assert not [d for d in k8s_docs() if d["metadata"]["name"] == f"embeddb-follower-{replicas}"]
    assert data["followers.txt"].split() == follower_addresses
    server = k8s_object("Deployment", "embeddb-model-server")
    sargs = server["spec"]["template"]["spec"]["containers"][0]["args"]
    assert option(sargs, "--addresses") == "/etc/embeddb/followers.txt"
    assert option(sargs, "--model") == yaml.safe_load(data["job.yaml"])["export_dir"]


def test_k8s_trainer_rendezvous_and_volumes_agree() -> None:
    job = k8s_object("Job", "embeddb-trainer")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    args = container["args"]
    assert option(args, "--nnodes") == str(spec["completions"])
    service = k8s_object("Service", pod["subdomain"])
    assert service["spec"]["clusterIP"] == "None"
    assert option(args, "--master-addr") == f"{job['metadata']['name']}-0.{pod['subdomain']}"
    rendezvous = next(p for p in service["spec"]["ports"] if p["name"] == "rendezvous")
    assert option(args, "--master-port") == str(rendezvous["port"])
    assert option(args, "--node-rank") == "$(NODE_RANK)"
    env = {e["name"]: e for e in container["env"]}
    assert "job-completion-index" in env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    # The export and checkpoint directories lie on the shared volumes the model server reads.
    data = k8s_object("ConfigMap", "embeddb-config")["data"]
    job_yaml = yaml.safe_load(data["job.yaml"])
    claims = {
        m["mountPath"]: v["persistentVolumeClaim"]["claimName"]
        for m in container["volumeMounts"]
        for v in pod["volumes"]
        if v["name"] == m["name"] and "persistentVolumeClaim" in v
    }
    for key in ("export_dir", "checkpoint_dir"):
        assert any(job_yaml[key].startswith(path + "/") for path in claims), key
    server = k8s_object("Deployment", "embeddb-model-server")["spec"]["template"]["spec"]
    server_claims = {
        v["persistentVolumeClaim"]["claimName"]
        for v in server["volumes"]
        if "persistentVolumeClaim" in v
    }
    export_claim = next(c for p, c in claims.items() if job_yaml["export_dir"].startswith(p + "/"))
    assert export_claim in server_claims
    pvc = k8s_object("PersistentVolumeClaim", export_claim)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
