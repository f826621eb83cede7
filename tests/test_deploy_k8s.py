"""The Kubernetes manifests (deploy/k8s/), checked statically like the Compose files in
``test_deploy.py``: every container runs a real command, tokens have the right roles, and
ports, probes, Services, shards and volumes agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from embeddb.errors import ConfigError
from embeddb.trainer.launcher.job import JobConfig
from tests.deploy_support import (
    DOCKER,
    EMBEDDB_IMAGES,
    K8S,
    NUM_SHARDS,
    TOKEN_MODES,
    Auth,
    accepted_tokens,
    check_auth,
    check_job,
    client_tokens,
    export_model_stub,
    host_of,
    image_copies,
    image_name,
    k8s_docs,
    k8s_object,
    local_job,
    map_args,
    map_path,
    option,
    parse_embeddb,
    pod_spec,
    write_secret,
)


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
    """Run ``python -m embeddb.trainer.launcher.run ARGS`` up to the training itself."""
    run = pytest.importorskip("embeddb.trainer.launcher.run")
    seen: list[tuple[JobConfig, Path]] = []
    monkeypatch.setattr(
        run, "train", lambda job, addresses, predict, **_: seen.append((job, addresses))
    )
    assert run.main(args) == 0
    return seen[0]


@pytest.mark.slow
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
            assert parsed.module and parsed.training_script == "embeddb.trainer.launcher.run", where
            mounts.update(image_copies(DOCKER / "Dockerfile.trainer"))
            script = map_args(parsed.training_script_args, mounts)
            script[0] = str(local_job(Path(script[0]), mounts, tmp_path / str(i)))
            job, addresses = parse_trainer_run(script, monkeypatch)
            check_job(Path(script[0]), mounts, tmp_path / str(i))
            assert list(addresses) == list(job.addresses or ())  # read from the mounted @FILE
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
            listed = option(script, "--addresses")
            assert listed.startswith("@"), listed  # the one spelling: --addresses @FILE
            for address in Path(listed[1:]).read_text().split():
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
    assert option(sargs, "--addresses") == "@/etc/embeddb/followers.txt"
    assert option(sargs, "--model") == yaml.safe_load(data["job.yaml"])["export_dir"]


@pytest.mark.slow
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
