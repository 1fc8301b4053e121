"""docs/deploy.md's Kubernetes manifest and nginx routing agree with the code and the tested
nginx configuration (the cluster itself is not run here)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from mcp_sandbox.lifecycle import Timings
from mcp_sandbox.server import HEALTH_PATH, METRICS_PATH, READY_PATH, SESSION_HEADER_TOKEN
from mcp_sandbox.settings import Settings
from tests.integration.test_instances import NGINX_CONFIG

DEPLOY = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
#: What nginx hashes on: the session header clients mirror `session_id` into, then the routing key.
ROUTE = f"$http_mcp_param_{SESSION_HEADER_TOKEN.lower().replace('-', '_')}$http_mcp_session_id"


def manifest() -> list[dict[str, Any]]:
    (block,) = re.findall(r"```yaml\n(.*?)```", DEPLOY, re.S)
    return [document for document in yaml.safe_load_all(block) if document]


def of_kind(kind: str) -> dict[str, Any]:
    (document,) = [document for document in manifest() if document["kind"] == kind]
    return document


def test_every_route_hashes_on_the_headers_the_server_sends_and_the_test_uses() -> None:
    annotations = of_kind("Ingress")["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/upstream-hash-by"] == ROUTE
    assert f'hash "{ROUTE}" consistent;' in NGINX_CONFIG
    assert f'hash "{ROUTE}" consistent;' in DEPLOY


def test_the_deployment_shares_state_and_serves_stateless_http() -> None:
    pod = of_kind("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    known = {f"MCP_SANDBOX_{name.upper()}" for name in Settings.model_fields}
    assert set(env) <= known, set(env) - known
    assert env["MCP_SANDBOX_STATELESS_HTTP"] == "true"
    (mount,) = container["volumeMounts"]
    assert env["MCP_SANDBOX_STATE_DIR"] == mount["mountPath"]
    claim = pod["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert of_kind("PersistentVolumeClaim")["metadata"]["name"] == claim
    assert of_kind("PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteMany"]
    # A stopping pod checkpoints its sessions first: the grace period must leave it the time.
    assert pod["terminationGracePeriodSeconds"] > Timings().closing_save
    assert container["command"] == ["mcp-sandbox"] and "--transport" in container["args"]


def test_the_probes_and_the_scrape_ask_the_paths_the_server_answers() -> None:
    pod = of_kind("Deployment")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    (port,) = [entry["containerPort"] for entry in container["ports"]]
    assert container["readinessProbe"]["httpGet"] == {"path": READY_PATH, "port": port}
    assert container["livenessProbe"]["httpGet"] == {"path": HEALTH_PATH, "port": port}
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == METRICS_PATH
    assert annotations["prometheus.io/port"] == str(port)
