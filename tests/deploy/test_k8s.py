"""deploy/k8s/ checked as a cluster and a user would read it.

Every manifest is validated against Kubernetes 1.31's own schemas (``kubernetes-validate``,
strict: an unknown field is an error), and ``kubectl kustomize`` renders the kustomization
when kubectl is installed. Then what the schema cannot see: the router's flags parse with
the router's own parser and settings; the grace period covers the drain; the probes hit the
endpoints that exist; every Service selects pods and the router's backend URLs name the
headless Services; the autoscaler and the disruption budget hold the router; the SGLang
servers' flags parse with SGLang's parser, are the ones ``deploy/sglang/launch.sh`` renders
for the same model, and differ only in speculation; no key is written in any manifest.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

try:
    import kubernetes_validate  # type: ignore[import-untyped]
    import yaml
except ImportError:  # pragma: no cover - the dev extra installs both
    pytest.skip(
        "kubernetes-validate is not installed: pip install -e '.[dev]'", allow_module_level=True
    )

from specroute.cli import parser
from specroute.policies.profile import parse_profile
from specroute.router.settings import RouterSettings
from specroute.serve_command import given_settings
from tests.sglang_launch import parse, render

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
KUBERNETES = "1.31"
NAMESPACE = "specroute"
# placeholders only: the real Secret is made by hand (keys.yaml says how)
PLACEHOLDER = "REPLACE-ME"
KEY_FLAGS = ("--api-key", "--admin-key", "--backend-api-key")
# what stopping may take past preStop, drain_grace and drain_timeout before SIGKILL
STOP_MARGIN = 5
# what a worker process may use: a core and about 100 MiB
WORKER_CPU, WORKER_MEMORY = 1.0, 100 * 2**20
# SGLang loads the weights and captures CUDA graphs before it answers
SGLANG_STARTUP_BUDGET = 15 * 60
SPECULATIVE = re.compile(r"--speculative-")
LLAMA_ENV = REPO / "deploy" / "sglang" / "llama3.1-8b.env"
# a pod has a network of its own: these are the launch line's that Kubernetes sets apart
NETWORK_FLAGS = ("--host", "--port", "--nccl-port")

Doc = dict[str, Any]


def manifests() -> dict[str, list[Doc]]:
    return {
        path.name: [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        for path in sorted(K8S.glob("*.yaml"))
        if path.name != "kustomization.yaml"
    }


MANIFESTS = manifests()
DOCS = [(name, doc) for name, docs in MANIFESTS.items() for doc in docs]
KUSTOMIZATION: Doc = yaml.safe_load((K8S / "kustomization.yaml").read_text())


def find(kind: str, name: str) -> Doc:
    (found,) = (d for _, d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name)
    return found


def of_kind(kind: str) -> list[Doc]:
    return [d for _, d in DOCS if d["kind"] == kind]


def pod(deployment: Doc) -> Doc:
    spec: Doc = deployment["spec"]["template"]["spec"]
    return spec


def container(deployment: Doc) -> Doc:
    (only,) = pod(deployment)["containers"]
    return dict(only)


ROUTER = find("Deployment", "specroute")
SGLANG = {pool: find("Deployment", f"sglang-{pool}") for pool in ("spec", "base")}
OTHER = {"spec": "base", "base": "spec"}


def quantity(value: str | int | float) -> float:
    """A Kubernetes quantity as a number: "500m" is 0.5, "256Mi" is 256 * 2**20."""
    text = str(value)
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, factor in sorted(suffixes.items(), key=lambda s: -len(s[0])):
        if text.endswith(suffix):
            return float(text.removesuffix(suffix)) * factor
    return float(text)


def literal_env(deployment: Doc) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(deployment).get("env", []) if "value" in e}


def expanded_args(deployment: Doc) -> list[str]:
    """The container's args as the kubelet runs them: ``$(VAR)`` replaced from its env."""
    values = literal_env(deployment)
    for e in container(deployment).get("env", []):
        field = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if field == "metadata.namespace":
            values[e["name"]] = deployment["metadata"]["namespace"]
    return [
        re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values.get(m[1], m[0]), arg)
        for arg in container(deployment)["args"]
    ]


def flag(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == name]


def selects(selector: dict[str, str], deployment: Doc) -> bool:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return selector.items() <= labels.items()


# what the kubelet would give the router from the Secret: the placeholders
def secret_env() -> dict[str, str]:
    secret = find("Secret", "specroute-keys")
    values: dict[str, str] = secret["stringData"]
    return values


def router_settings(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> RouterSettings:
    """The settings ``specroute serve`` would start with: the flags as its parser reads them,
    the environment as the pod would have it."""
    for name, value in {**literal_env(ROUTER), **secret_env()}.items():
        monkeypatch.setenv(name, value)
    try:
        args = parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"specroute refuses the flags: {argv}")
    return RouterSettings(**given_settings(args))


def test_there_is_something_to_check() -> None:
    kinds = {d["kind"] for _, d in DOCS}
    assert kinds >= {
        "Namespace",
        "Deployment",
        "Service",
        "ConfigMap",
        "Secret",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
    }


@pytest.mark.parametrize(
    "doc", [d for _, d in DOCS], ids=[f"{n}:{d['kind']}/{d['metadata']['name']}" for n, d in DOCS]
)
def test_the_manifest_validates(doc: Doc) -> None:
    try:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"{'.'.join(map(str, error.path))}: {error.message}")


def test_the_kustomization_lists_every_manifest_but_the_keys() -> None:
    assert KUSTOMIZATION["namespace"] == NAMESPACE
    # applying the placeholders would overwrite the real Secret's keys
    assert set(KUSTOMIZATION["resources"]) == set(MANIFESTS) - {"keys.yaml"}
    assert find("Namespace", NAMESPACE)
    for name, doc in DOCS:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == NAMESPACE, name  # `kubectl apply -f` too
    (image,) = KUSTOMIZATION["images"]
    assert container(ROUTER)["image"].partition(":")[0] == image["name"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_renders_the_kustomization() -> None:
    run = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    rendered = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(run.stdout)}
    listed = {
        (d["kind"], d["metadata"]["name"])
        for name in KUSTOMIZATION["resources"]
        for d in MANIFESTS[name]
    }
    assert rendered == listed


def test_the_router_flags_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = expanded_args(ROUTER)
    assert argv[0] == "serve"
    settings = router_settings(argv, monkeypatch)
    assert settings.workers == 2 and settings.http.port == 8000 and settings.http.host == "0.0.0.0"
    assert settings.backends.spec[0].startswith("dns+http://") and settings.backends.base[
        0
    ].startswith("dns+http://")
    assert settings.routing.concurrency_source == "replicas"
    assert settings.policy_params() == {"topology": "partitioned"} and not settings.deprecated()
    assert [key.get_secret_value() for key in settings.admission.api_keys] == [PLACEHOLDER]
    assert settings.admin_key is not None and settings.upstream.api_key is not None
    assert settings.drain_grace == 5 and settings.drain_timeout == 30


def test_the_backend_urls_name_the_headless_services() -> None:
    argv = expanded_args(ROUTER)
    for pool in ("spec", "base"):
        (url,) = flag(argv, f"--{pool}")
        parts = urlsplit(url.removeprefix("dns+"))
        service = find("Service", f"sglang-{pool}")
        namespace = service["metadata"]["namespace"]
        assert parts.hostname == f"sglang-{pool}.{namespace}.svc.cluster.local"
        assert service["spec"]["clusterIP"] == "None", "only a headless name answers each pod"
        assert parts.port in [p["port"] for p in service["spec"]["ports"]] and parts.port == 30000
        assert selects(service["spec"]["selector"], SGLANG[pool])
        assert not selects(service["spec"]["selector"], SGLANG[OTHER[pool]])
        labels = SGLANG[pool]["spec"]["template"]["metadata"]["labels"]
        assert labels["specroute.dev/pool"] == pool


def test_the_peers_flag_names_the_routers_headless_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replicas find each other as they find the servers, each ready router pod an
    address, and ask each other with the one admin key of the Secret."""
    argv = expanded_args(ROUTER)
    (peers,) = flag(argv, "--online-peers")
    parts = urlsplit(peers.removeprefix("dns+"))
    (service,) = (
        s
        for s in of_kind("Service")
        if s["spec"].get("clusterIP") == "None" and selects(s["spec"]["selector"], ROUTER)
    )
    namespace, name = service["metadata"]["namespace"], service["metadata"]["name"]
    assert peers.startswith("dns+http://") and namespace == ROUTER["metadata"]["namespace"]
    assert parts.hostname == f"{name}.{namespace}.svc.cluster.local"
    assert parts.port in [p["port"] for p in service["spec"]["ports"]] and parts.port == 8000
    assert service["spec"]["publishNotReadyAddresses"] is False, "a replica not ready is asked"
    env = {e["name"]: e for e in container(ROUTER)["env"]}
    key = env["SPECROUTE_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]
    assert key["name"] == "specroute-keys" and not key.get("optional", False)
    assert "SPECROUTE_ADMIN_KEY" in secret_env()
    settings = router_settings(argv, monkeypatch)
    assert settings.online.peers == [peers] and settings.admin_key is not None


def test_the_profile_is_mounted_where_the_router_reads_it() -> None:
    (path,) = flag(expanded_args(ROUTER), "--profile")
    config = find("ConfigMap", "specroute-profile")
    folder, _, key = path.rpartition("/")
    (mount,) = (m for m in container(ROUTER)["volumeMounts"] if m["mountPath"] == folder)
    assert "subPath" not in mount, "a subPath mount never sees the ConfigMap change"
    (volume,) = (v for v in pod(ROUTER)["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == config["metadata"]["name"]
    profile = parse_profile(json.loads(config["data"][key]))
    assert profile.crossover.value is not None and profile.accept_length is not None


def test_the_grace_period_covers_the_drain() -> None:
    env = literal_env(ROUTER)
    grace, timeout = float(env["SPECROUTE_DRAIN_GRACE"]), float(env["SPECROUTE_DRAIN_TIMEOUT"])
    command = container(ROUTER)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    needed = pre_stop + grace + timeout + STOP_MARGIN
    assert pod(ROUTER)["terminationGracePeriodSeconds"] >= needed


def test_the_probes_hit_the_routers_endpoints() -> None:
    router = container(ROUTER)
    ports = {p["name"]: p["containerPort"] for p in router["ports"]}
    assert ports == {"http": 8000}
    for probe, path in (("readinessProbe", "/ready"), ("livenessProbe", "/health")):
        get = router[probe]["httpGet"]
        assert get["path"] == path and ports.get(get["port"], get["port"]) == 8000
        assert "httpHeaders" not in get, "the probes need no key"


@pytest.mark.parametrize("pool", ["spec", "base"])
def test_sglang_probes_wait_for_the_model(pool: str) -> None:
    server = container(SGLANG[pool])
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {"http": 30000}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = server[probe]["httpGet"]
        assert get["path"] in ("/health", "/health_generate") and ports[get["port"]] == 30000
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= SGLANG_STARTUP_BUDGET


def test_every_service_selects_pods() -> None:
    deployments = of_kind("Deployment")
    for deployment in deployments:
        assert selects(deployment["spec"]["selector"]["matchLabels"], deployment)
    for service in of_kind("Service"):
        (target,) = (d for d in deployments if selects(service["spec"]["selector"], d))
        names = {p["name"] for c in pod(target)["containers"] for p in c["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= names
    router = find("Service", "specroute")
    assert router["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert [p["port"] for p in router["spec"]["ports"]] == [8000]
    assert selects(router["spec"]["selector"], ROUTER)


def test_the_autoscaler_and_the_budget_hold_the_router() -> None:
    (hpa,) = of_kind("HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", ROUTER["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 2 and ROUTER["spec"]["replicas"] >= 2
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert "cpu" in container(ROUTER)["resources"]["requests"], "utilisation is of the request"
    (pdb,) = of_kind("PodDisruptionBudget")
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert [d["metadata"]["name"] for d in of_kind("Deployment") if selects(selector, d)] == [
        ROUTER["metadata"]["name"]
    ]
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"], "a drain could never start"


def test_the_router_has_room_for_its_workers() -> None:
    (workers,) = flag(expanded_args(ROUTER), "--workers")
    resources = container(ROUTER)["resources"]
    assert quantity(resources["limits"]["cpu"]) >= int(workers) * WORKER_CPU
    assert quantity(resources["requests"]["memory"]) >= int(workers) * WORKER_MEMORY
    assert quantity(resources["limits"]["memory"]) >= quantity(resources["requests"]["memory"])


def test_the_router_runs_unprivileged() -> None:
    security = pod(ROUTER)["securityContext"]
    assert security["runAsNonRoot"] is True
    context = container(ROUTER)["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    # the workers keep their shared metrics files in a temporary folder
    assert "/tmp" in {m["mountPath"] for m in container(ROUTER)["volumeMounts"]}
    (user,) = re.findall(r"^USER (\d+)", DOCKERFILE.read_text(), re.MULTILINE)
    assert security["runAsUser"] == int(user), "the image's user is the one the pod runs as"


def test_no_key_is_written_in_a_manifest() -> None:
    for name, doc in DOCS:
        if doc["kind"] == "Secret":
            assert name == "keys.yaml" and "data" not in doc
            for key, value in doc["stringData"].items():
                values = json.loads(value) if value.startswith("[") else [value]
                assert values == [PLACEHOLDER], f"{name}: {key} holds more than a placeholder"
        for spec in [d for d in [doc.get("spec", {}).get("template", {}).get("spec")] if d]:
            for c in spec["containers"]:
                words = [*c.get("command", []), *c.get("args", [])]
                assert not [w for w in words if w.split("=")[0] in KEY_FLAGS], name
                for e in c.get("env", []):
                    if "KEY" in e["name"]:
                        assert "secretKeyRef" in e.get("valueFrom", {}), f"{name}: {e['name']}"


@pytest.fixture(scope="module")
def sglang_args() -> dict[str, dict[str, Any]]:
    for deployment in SGLANG.values():
        assert container(deployment)["command"] == ["python3", "-m", "sglang.launch_server"]
    return parse({pool: container(d)["args"] for pool, d in SGLANG.items()})


@pytest.mark.parametrize("pool", ["spec", "base"])
def test_sglang_parses_the_servers_args(sglang_args: dict[str, dict[str, Any]], pool: str) -> None:
    result = sglang_args[pool]
    assert "error" not in result, result.get("error")
    args = result["args"]
    gpus = container(SGLANG[pool])["resources"]["limits"]["nvidia.com/gpu"]
    assert args["tp_size"] == gpus == 4, "one tensor-parallel rank per GPU"
    assert args["enable_metrics"] and args["port"] == 30000 and args["host"] == "0.0.0.0"
    assert args["max_running_requests"] <= args["cuda_graph_max_bs_decode"]
    if pool == "spec":
        assert args["speculative_algorithm"] == "EAGLE3"
        assert args["speculative_draft_model_path"]
    else:
        assert args["speculative_algorithm"] is None


def pairs(argv: list[str]) -> dict[str, str | None]:
    """A launch line as flag: value (None for a switch); every flag here is given once."""
    found: dict[str, str | None] = {}
    for i, word in enumerate(argv):
        if word.startswith("--"):
            following = argv[i + 1] if i + 1 < len(argv) else "--"
            assert word not in found, word
            found[word] = None if following.startswith("--") else following
    return found


def test_the_servers_differ_only_in_speculation() -> None:
    spec, base = (pairs(container(SGLANG[pool])["args"]) for pool in ("spec", "base"))
    assert {k: v for k, v in spec.items() if not SPECULATIVE.match(k)} == base
    assert not [k for k in base if SPECULATIVE.match(k)]
    (spec_pod, base_pod) = (container(SGLANG[pool]) for pool in ("spec", "base"))
    for same in ("image", "resources", "volumeMounts"):
        assert spec_pod[same] == base_pod[same], same


@pytest.mark.parametrize("pool", ["spec", "base"])
def test_the_servers_take_launch_sh_flags(pool: str) -> None:
    launched = pairs(render(LLAMA_ENV, "partitioned", pool).argv)
    here = pairs(container(SGLANG[pool])["args"])
    for network in NETWORK_FLAGS:
        launched.pop(network, None)
        here.pop(network, None)
    assert here == launched
