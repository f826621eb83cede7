"""The deployment files (docker/, deploy/k8s/), checked statically: Docker cannot run here.

Every container command is parsed by our own CLI (click, so an unknown option fails; torchrun's
and ``embeddb.trainer.launcher.run``'s parsers for the training pods), with the container paths it
names
mapped to the files the deployment mounts there. Ports, addresses and shard counts must agree
across commands, Services, probes and scrape targets; the mounted configs must load with our
loaders; every metric the Grafana dashboard queries must be exported by a real server or by
the registries of the trainer and the model server. Bearer tokens: the env file of
docker/make_secrets.py is generated in tmp and delivered as Compose and Kubernetes would (file
owners and modes included), and every token a command sends must have the right role among the
tokens its server accepts: replica for followers, ro for the model server, rw for the trainer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from embeddb.errors import ConfigError
from embeddb.transport.rpc.auth import Role
from tests.deploy_support import (
    COMPOSE,
    DOCKER,
    NUM_SHARDS,
    ROOT,
    check_auth,
    compose_auth,
    compose_services,
    dockerfile_exposed,
    dockerfile_healthcheck_port,
    export_model_stub,
    ignored,
    load_compose,
    option,
    options,
    parse_embeddb,
)


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


@pytest.mark.slow
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
    # a config the deployment does not mount (a missing file: exit 1, not a usage error)
    with pytest.raises(click.ClickException, match="does not exist"):
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
    assert option(server.command, "--addresses").split(",") == [
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


def dockerfile_stages(text: str) -> list[tuple[str | None, str]]:
    """(``AS`` name or None, the instructions) of each ``FROM`` of a Dockerfile, in order."""
    parts = re.split(r"^FROM \S+(?: AS (\S+))?[ \t]*\n", text, flags=re.M)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def context_sources(text: str) -> list[str]:
    """The build-context paths a Dockerfile reads: ``COPY`` sources and ``--mount=type=bind``
    sources (not those ``from=`` another stage)."""
    copies = [line.split()[:-1] for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M)]
    mounts = re.findall(r"--mount=type=bind,(?![^\s]*from=)[^\s]*?source=([^,\s]+)", text)
    return [s for line in copies for s in line] + mounts


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.trainer"])
def test_dockerfile_context_sources_exist_and_are_in_the_build_context(dockerfile: str) -> None:
    text = (DOCKER / dockerfile).read_text()
    sources = context_sources(text)
    assert "constraints/dev.txt" in sources and "embeddb" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not ignored(source), f"{source} is excluded by .dockerignore"
    assert re.search(r"^USER (?!root|0\b)\S+", text, re.M), "the image must not run as root"
    assert re.search(r'^ENTRYPOINT \["embeddb"\]', text, re.M)
    # the top-level client/ and trainer/ are links into embeddb/ (COPY would copy them dangling)
    assert not {"client", "trainer"} & set(sources)


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.trainer"])
def test_the_image_installs_the_wheel_built_from_the_sdist_not_the_source_tree(
    dockerfile: str,
) -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (builder, build), (runtime, run) = dockerfile_stages((DOCKER / dockerfile).read_text())
    assert builder == "wheel" and runtime is None
    # The builder copies what the sdist is made of (pyproject's readme and licence files, the
    # package, MANIFEST.in) and builds the sdist, then the wheel from it.
    copied = set(context_sources(build))
    wanted = {"pyproject.toml", "MANIFEST.in", project["readme"], *project["license-files"]}
    assert wanted | {"embeddb"} <= copied, wanted - copied
    assert re.search(r"^RUN .*python -m build --outdir /wheels \.$", build, re.M)
    # The runtime stage holds none of the source tree: it installs the builder's wheel (a
    # bind mount of the builder's /wheels) with CI's versions, and no `pip install .`.
    assert not {"pyproject.toml", "embeddb"} & set(context_sources(run))
    assert "--mount=type=bind,from=wheel,source=/wheels,target=/wheels" in run
    assert "--mount=type=bind,source=constraints/dev.txt,target=/tmp/constraints.txt" in run
    wheel = f"/wheels/{canonicalize_name(project['name']).replace('-', '_')}-*.whl"
    commands = [c.strip() for c in re.split(r"&&|\n", run.replace("\\\n", " "))]
    (install,) = [c for c in commands if c.startswith("pip install") and wheel in c]
    assert install.endswith("-c /tmp/constraints.txt"), install
    assert not re.search(r"pip install (-e )?[\"']?\.([\"'\[\s]|$)", build + run, re.M)


def test_the_server_images_default_command_is_real(tmp_path: Path) -> None:
    text = (DOCKER / "Dockerfile").read_text()
    match = re.search(r"^CMD (\[.*?\])\s*$", text, re.M | re.S)
    assert match
    args = json.loads(match.group(1).replace("\\\n", ""))
    name, params = parse_embeddb(args, {})
    assert name == "serve" and params["port"] == dockerfile_healthcheck_port(DOCKER / "Dockerfile")
    assert params["metrics_port"] in dockerfile_exposed(DOCKER / "Dockerfile")


def test_trainer_image_torch_index_is_a_build_arg_and_the_pin_is_cis() -> None:
    import tomllib

    text = (DOCKER / "Dockerfile.trainer").read_text()
    assert re.search(r"^ARG TORCH_INDEX_URL=https://download\.pytorch\.org/whl/cpu$", text, re.M)
    # torch's pin is read from the constraints CI installs with, not repeated here ...
    assert "\"$(grep -E '^torch==' /tmp/constraints.txt)\"" in text
    assert '--index-url "${TORCH_INDEX_URL}"' in text
    pins = (ROOT / "constraints" / "dev.txt").read_text().splitlines()
    (torch,) = [line for line in pins if line.startswith("torch==")]
    # ... and lies in the trainer extra's range, which the wheel's [trainer] install checks.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (extra,) = [
        Requirement(r) for r in project["optional-dependencies"]["trainer"] if r.startswith("torch")
    ]
    assert extra.name == "torch" and Version(torch.split("==")[1]) in extra.specifier
    readme = (DOCKER / "README.md").read_text()
    assert "TORCH_INDEX_URL" in readme and "cu1" in readme
