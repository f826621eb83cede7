"""Shared helpers of the deployment tests (test_deploy*.py): the files' paths, parsed
commands, mounted paths and who sends and accepts which token. See ``test_deploy.py``."""

from __future__ import annotations

import fnmatch
import importlib.util
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import yaml

from embeddb.cli import main
from embeddb.cli.target import parse_addresses
from embeddb.common.secrets import read_token_file
from embeddb.config import EmbeddingConfig
from embeddb.trainer.launcher.job import JobConfig
from embeddb.transport.rpc.auth import Role, Tokens

ROOT = Path(__file__).resolve().parent.parent


DOCKER = ROOT / "docker"


K8S = ROOT / "deploy" / "k8s"


COMPOSE = DOCKER / "compose.yaml"


DASHBOARD = DOCKER / "grafana" / "dashboards" / "embeddb.json"


PRESETS = ROOT / "embeddb" / "presets"


EMBEDDB_IMAGES = {"embeddb", "embeddb-trainer"}


NUM_SHARDS = 2


IMAGE_UID = "10001"  # USER of both Dockerfiles


TOKEN_MODES = (0o400, 0o600)  # what embeddb.common.secrets.check_private_file accepts


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
    """``value`` with a container path under a mount point replaced by the local path (also
    after the ``@`` of an ``--addresses @FILE``)."""
    if value.startswith("@"):
        return "@" + map_path(value[1:], mounts)
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


def make_tokens_env(tmp_path: Path) -> dict[str, str]:
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
        addresses = parse_addresses(params["addresses"]) + parse_addresses(params["legacy_shard"])
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
