"""The compose file and the Kubernetes manifests agree with the settings model and each other.

Every MEMSTREAM_* variable they set must name a real ``Settings`` field (``__`` nests) and
hold a value the field accepts; the manifests must pass the Kubernetes 1.37 JSON schemas
(``kubernetes-validate``, bundled schemas, no network) in strict mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from memstream.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
PREFIX = "MEMSTREAM_"


def settings_field(env_name: str) -> str | None:
    """The dotted Settings field an environment variable sets, or None when it sets none."""
    if not env_name.startswith(PREFIX):
        return None
    model: type[BaseModel] = Settings
    path: list[str] = []
    parts = env_name.removeprefix(PREFIX).lower().split("__")
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return None
        path.append(part)
        nested = field.annotation
        if i < len(parts) - 1:
            if not (isinstance(nested, type) and issubclass(nested, BaseModel)):
                return None
            model = nested
        elif isinstance(nested, type) and issubclass(nested, BaseModel):
            return None  # a whole section is not one setting
    return ".".join(path)


def load_settings(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings as a process with exactly this environment would build them."""
    import os

    for name in [n for n in os.environ if n.startswith(PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    return Settings()


def test_settings_field_mapping() -> None:
    assert settings_field("MEMSTREAM_KAFKA__BROKER") == "kafka.broker"
    assert settings_field("MEMSTREAM_METRICS_PORT") == "metrics_port"
    assert settings_field("MEMSTREAM_KAFKA__NOPE") is None
    assert settings_field("MEMSTREAM_KAFKA") is None
    assert settings_field("MEMSTREAM_LOG_LEVEL__X") is None


# -- compose ----------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def memstream_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose()["services"].items() if n.startswith("memstream-")}


def test_compose_runs_the_whole_stack() -> None:
    services = compose()["services"]
    assert set(services) == {
        "kafka",
        "redis",
        "qdrant",
        "prometheus",
        "grafana",
        "memstream-worker",
        "memstream-consolidator",
        "memstream-serve",
    }
    for name, service in services.items():
        assert "healthcheck" in service, f"{name} has no healthcheck"
    assert "controller" in services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft
    for name, service in memstream_services().items():
        assert service["build"]["dockerfile"] == "deploy/Dockerfile", name
        assert service["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert (DEPLOY / "Dockerfile").exists()
    published = {
        p.rsplit(":", 2)[-1]: name for name, s in services.items() for p in s.get("ports", [])
    }
    assert published == {"8080": "memstream-serve", "9090": "prometheus", "3000": "grafana"}
    for name, service in services.items():  # nothing listens beyond this machine by default
        assert all(p.startswith("127.0.0.1:") for p in service.get("ports", [])), name


def test_compose_variables_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, service in memstream_services().items():
        env = service["environment"]
        unknown = [v for v in env if settings_field(v) is None]
        assert not unknown, f"{name}: {unknown} are not Settings fields"
        settings = load_settings(env, monkeypatch)
        assert settings.qdrant.backend == "client", "Qdrant Edge is one-process"
        assert settings.kafka.broker.startswith("kafka://kafka:")
        assert settings.redis.url.startswith("redis://redis:")
        if name == "memstream-serve":
            assert settings.rpc.host == "0.0.0.0"
        else:
            assert settings.metrics_port
            assert settings.metrics_host == "0.0.0.0"


def test_compose_healthchecks_ask_readiness() -> None:
    """Each memstream container is healthy when its own port answers /readyz."""
    for name, service in memstream_services().items():
        env = service["environment"]
        port = env.get("MEMSTREAM_METRICS_PORT") or env.get("MEMSTREAM_RPC__PORT")
        probe = " ".join(service["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}/readyz" in probe, name


def test_prometheus_scrapes_the_compose_processes() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {
        t for job in config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]
    }
    services = memstream_services()
    expected = set()
    for name, service in services.items():
        env = service["environment"]
        port = env.get("MEMSTREAM_METRICS_PORT") or env.get("MEMSTREAM_RPC__PORT")
        expected.add(f"{name}:{port}")
    assert targets == expected
    mounts = compose()["services"]["prometheus"]["volumes"]
    assert "./prometheus:/etc/prometheus:ro" in mounts
    grafana = compose()["services"]["grafana"]["volumes"]
    assert "./grafana/dashboards:/var/lib/grafana/dashboards:ro" in grafana
    for mount in (*mounts, *grafana):
        source = mount.split(":")[0]
        if source.startswith("./"):
            assert (DEPLOY / source).exists(), source


# -- Kubernetes -------------------------------------------------------------------------


def manifests() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in manifests() if d["kind"] == kind}


def test_manifests_pass_the_kubernetes_schemas() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for doc in manifests():
        kv.validate(doc, "1.37.0", strict=True)
    broken = by_kind("Deployment")["memstream-rpc"]
    broken = {**broken, "spec": {**broken["spec"], "replicas": "three"}}
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, "1.37.0", strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_deployments_probe_limit_and_take_their_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    deployments = by_kind("Deployment")
    assert set(deployments) == {"memstream-worker", "memstream-consolidator", "memstream-rpc"}
    config = by_kind("ConfigMap")["memstream-config"]["data"]
    secret = by_kind("Secret")["memstream-secrets"]["stringData"]
    commands = {}
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]
        assert (
            deployment["spec"]["selector"]["matchLabels"].items()
            <= pod["metadata"]["labels"].items()
        )
        (container,) = pod["spec"]["containers"]
        commands[name] = container["args"][0]
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), name
        assert {"cpu", "memory"} <= set(resources["limits"]), name
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", name
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz", name
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", name
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        probe_port = container["readinessProbe"]["httpGet"]["port"]
        assert probe_port in ports, name
        refs = {
            r.get("configMapRef", {}).get("name") or r["secretRef"]["name"]
            for r in container["envFrom"]
        }
        assert refs == {"memstream-config", "memstream-secrets"}, name
        env = {**config, **secret, **{e["name"]: e["value"] for e in container.get("env", [])}}
        unknown = [v for v in (*env, *secret) if settings_field(v) is None]
        assert not unknown, f"{name}: {unknown} are not Settings fields"
        settings = load_settings(env, monkeypatch)
        served = settings.rpc.port if commands[name] == "serve" else settings.metrics_port
        assert ports[probe_port] == served, name
        annotations = pod["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(served), name
    assert commands == {
        "memstream-worker": "worker",
        "memstream-consolidator": "consolidator",
        "memstream-rpc": "serve",
    }


def test_secrets_hold_only_secret_settings() -> None:
    secret = by_kind("Secret")["memstream-secrets"]["stringData"]
    assert set(secret) == {
        "MEMSTREAM_RPC__API_KEYS",
        "MEMSTREAM_QDRANT__API_KEY",
        "MEMSTREAM_LLM__API_KEY",
    }
    config = by_kind("ConfigMap")["memstream-config"]["data"]
    assert not set(config) & set(secret)
    assert not [k for k in config if "KEY" in k]


def test_rpc_scales_and_survives_disruption() -> None:
    (hpa,) = by_kind("HorizontalPodAutoscaler").values()
    assert hpa["spec"]["scaleTargetRef"]["name"] == "memstream-rpc"
    assert hpa["spec"]["minReplicas"] >= 2
    budgets = by_kind("PodDisruptionBudget")
    assert "memstream-rpc" in budgets
    deployments = by_kind("Deployment")
    for name, budget in budgets.items():
        labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert budget["spec"]["minAvailable"] < max(
            deployments[name]["spec"]["replicas"], hpa["spec"]["minReplicas"]
        )
    (service,) = by_kind("Service").values()
    assert (
        service["spec"]["selector"]
        == deployments["memstream-rpc"]["spec"]["selector"]["matchLabels"]
    )
