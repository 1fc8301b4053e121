"""docs/deploy.md's Kubernetes manifest and nginx routing agree with the code and the tested
nginx configuration (the cluster itself is not run here)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from mcp_sandbox.lifecycle import Timings
from mcp_sandbox.server import HEALTH_PATH, METRICS_PATH, READY_PATH, SESSION_HEADER_TOKEN
from mcp_sandbox.settings import Settings
from tests.integration.test_instances import NGINX_CONFIG

DEPLOY = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
#: What nginx hashes on: the session header clients mirror `session_id` into, then the routing key.
ROUTE = f"$http_mcp_param_{SESSION_HEADER_TOKEN.lower().replace('-', '_')}$http_mcp_session_id"


#: The manifests, in the order the document gives them: sessions in a shared folder, then in Redis.
MANIFESTS = ("folder", "redis")


def manifest(which: str) -> list[dict[str, Any]]:
    blocks = re.findall(r"```yaml\n(.*?)```", DEPLOY, re.S)
    assert len(blocks) == len(MANIFESTS)
    return [document for document in yaml.safe_load_all(blocks[MANIFESTS.index(which)]) if document]


def of_kind(kind: str, which: str, name: str = "mcp-sandbox") -> dict[str, Any]:
    (document,) = [d for d in manifest(which) if d["kind"] == kind and d["metadata"]["name"] == name]
    return document


def server_container(which: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, str | None]]:
    """The server's pod spec, its container, and the container's settings."""
    pod = of_kind("Deployment", which)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    known = {f"MCP_SANDBOX_{name.upper()}" for name in Settings.model_fields}
    assert set(env) <= known, set(env) - known
    return pod, container, env


@pytest.mark.parametrize("which", MANIFESTS)
def test_every_route_hashes_on_the_headers_the_server_sends_and_the_test_uses(which: str) -> None:
    annotations = of_kind("Ingress", which)["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/upstream-hash-by"] == ROUTE
    assert f'hash "{ROUTE}" consistent;' in NGINX_CONFIG
    assert f'hash "{ROUTE}" consistent;' in DEPLOY


@pytest.mark.parametrize("which", MANIFESTS)
def test_the_server_serves_stateless_http_and_has_time_to_checkpoint_when_stopped(which: str) -> None:
    pod, container, env = server_container(which)
    assert env["MCP_SANDBOX_STATELESS_HTTP"] == "true"
    # A stopping pod checkpoints its sessions first: the grace period must leave it the time.
    assert pod["terminationGracePeriodSeconds"] > Timings().closing_save
    assert container["command"] == ["mcp-sandbox"] and "--transport" in container["args"]


def test_the_folder_deployment_shares_a_volume_many_pods_can_write() -> None:
    pod, container, env = server_container("folder")
    (mount,) = container["volumeMounts"]
    assert env["MCP_SANDBOX_STATE_DIR"] == mount["mountPath"]
    claim = pod["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert of_kind("PersistentVolumeClaim", "folder", "mcp-sandbox-state")["metadata"]["name"] == claim
    assert of_kind("PersistentVolumeClaim", "folder", "mcp-sandbox-state")["spec"]["accessModes"] == [
        "ReadWriteMany"
    ]


def test_the_redis_deployment_needs_no_shared_volume_and_reaches_its_redis() -> None:
    pod, container, env = server_container("redis")
    assert "volumeMounts" not in container and "volumes" not in pod and "MCP_SANDBOX_STATE_DIR" not in env
    settings = Settings(state_url=env["MCP_SANDBOX_STATE_URL"])
    assert settings.redis_url is not None
    url = urlsplit(settings.redis_url)
    service = of_kind("Service", "redis", "mcp-sandbox-redis")
    assert url.hostname == service["metadata"]["name"]
    assert url.port == service["spec"]["ports"][0]["port"]
    redis = of_kind("Deployment", "redis", "mcp-sandbox-redis")
    assert redis["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    (server,) = redis["spec"]["template"]["spec"]["containers"]
    args = dict(zip(server["args"][::2], server["args"][1::2], strict=True))
    # Never evict a session's keys; keep them across a restart of Redis.
    assert args["--maxmemory-policy"] == "noeviction" and args["--appendonly"] == "yes"
    claims = [d for d in manifest("redis") if d["kind"] == "PersistentVolumeClaim"]
    assert [claim["spec"]["accessModes"] for claim in claims] == [["ReadWriteOnce"]]


@pytest.mark.parametrize("which", MANIFESTS)
def test_the_probes_and_the_scrape_ask_the_paths_the_server_answers(which: str) -> None:
    pod = of_kind("Deployment", which)["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    (port,) = [entry["containerPort"] for entry in container["ports"]]
    assert container["readinessProbe"]["httpGet"] == {"path": READY_PATH, "port": port}
    assert container["livenessProbe"]["httpGet"] == {"path": HEALTH_PATH, "port": port}
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == METRICS_PATH
    assert annotations["prometheus.io/port"] == str(port)
