"""The dashboard, alert rules, Prometheus config, compose stack and Kubernetes manifests are
code: each is checked with the tool that would run it (promtool, the Compose schema, the
Kubernetes API schemas, the Prometheus operator's CRD schemas) and against the metric names
the bus really exports.

Redis' ACL is tested on real servers in test_redis_acl.py, and every query against a real
Prometheus in test_prometheus_live.py. A missing tool skips a test on a developer's machine
and fails it in CI; ``scripts/ensure-tools.sh`` installs them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from redisbus.metrics import FLEET_COUNTERS, FLEET_GAUGES, NOT_ON_DASHBOARD
from tests.support.deploy_support import (
    DEPLOY,
    GRAFANA,
    K8S,
    LATENCY_BUCKET,
    PROM_DIR,
    RANGE_FUNCS,
    REDIS_DIR,
    client_metric_names,
    known_metric_names,
    metric_names,
    yaml_docs,
)
from tests.support.prometheus_fixture import (
    DASHBOARD,
    ROOT,
    alert_queries,
    dashboard_panels,
    dashboard_queries,
    require_module,
    require_tool,
)

PLACEHOLDER_HASH = "#" + "0" * 64


# --- Prometheus rules and config -----------------------------------------------------------------


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), *args],
        cwd=PROM_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_alert_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_unit_tests_pass() -> None:
    result = promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_config_is_valid() -> None:
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    (tests_doc,) = yaml_docs(PROM_DIR / "alerts_test.yml")
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests_doc["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else quiet).add(check["alertname"])
    alerts = {name for name, _ in alert_queries()}
    assert alerts == ALERT_NAMES
    assert firing == alerts
    assert quiet == alerts


ALERT_NAMES = {
    "RedisbusStaleUnread",
    "RedisbusDeadLettersGrowing",
    "RedisbusRefusalRateHigh",
    "RedisbusDeliveryLatencyP99High",
    "RedisbusExporterDown",
    "RedisbusRedisDown",
    "RedisbusRedisMemoryNearLimit",
    "RedisbusEvictionPolicyUnsafe",
    "RedisbusAgentHostDown",
    "RedisbusSentButNotReceived",
    "RedisbusStoredEntriesLost",
    "RedisbusExporterChannelsSkipped",
}
RUNBOOK = ROOT / "docs" / "runbook.md"
RUNBOOK_URL = "https://redisbus.readthedocs.io/en/latest/runbook/"


def alert_rules() -> list[dict[str, Any]]:
    (doc,) = yaml_docs(PROM_DIR / "alerts.yml")
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def markdown_anchors(path: Path) -> set[str]:
    """The anchors MkDocs gives the headings of a page (Python-Markdown's toc slugify)."""
    anchors = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            slug = re.sub(r"[^\w\s-]", "", text)
            anchors.add(re.sub(r"[-\s]+", "-", slug).strip("-"))
    return anchors


def test_every_alert_links_its_own_section_of_the_runbook() -> None:
    anchors = markdown_anchors(RUNBOOK)
    for rule in alert_rules():
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == RUNBOOK_URL, (rule["alert"], url)
        assert anchor == rule["alert"].lower() and anchor in anchors, (rule["alert"], url)
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"].startswith("redisbus: "), rule["alert"]
        assert len(rule["annotations"]["description"]) > 80, rule["alert"]
    # and the runbook has a section for no alert that does not exist
    assert {a for a in anchors if a.startswith("redisbus")} == {n.lower() for n in ALERT_NAMES}


def test_runbook_urls_point_into_the_site_the_repo_publishes() -> None:
    # the site's address is mkdocs.yml's, the hosting config builds that mkdocs.yml strictly,
    # and the docs workflow builds it on every push and checks each runbook_url's anchor
    (mkdocs,) = yaml_docs(ROOT / "mkdocs.yml")
    assert mkdocs["site_url"] + "runbook/" == RUNBOOK_URL
    (rtd,) = yaml_docs(ROOT / ".readthedocs.yaml")
    assert rtd["mkdocs"] == {"configuration": "mkdocs.yml", "fail_on_warning": True}
    (workflow,) = yaml_docs(ROOT / ".github" / "workflows" / "docs.yml")
    steps = " ".join(str(step.get("run", "")) for step in workflow["jobs"]["build"]["steps"])
    assert "mkdocs build --strict" in steps and "runbook_url" in steps


def test_redis_down_alerts_on_the_exporters_own_gauge_not_on_up() -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    # the exporter answers while Redis does not: its `up` stays 1, so the alert needs its gauge
    assert rules["RedisbusRedisDown"]["expr"].strip() == "redisbus_exporter_redis_up == 0"
    assert rules["RedisbusAgentHostDown"]["expr"].strip() == 'up{job="redisbus-agents"} == 0'
    memory = rules["RedisbusRedisMemoryNearLimit"]["expr"]
    assert "redisbus_redis_memory_used_bytes" in memory and "> 0)" in memory


def test_alert_rules_read_only_metrics_the_bus_exports() -> None:
    known = known_metric_names()
    for name, expr in alert_queries():
        assert metric_names(expr) <= known, (name, metric_names(expr) - known)


# --- Grafana dashboard ---------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return doc


def panels_with_queries() -> list[dict[str, Any]]:
    return [p for p in dashboard_panels() if p["type"] != "row"]


def test_committed_dashboard_is_what_the_generator_writes() -> None:
    result = subprocess.run(
        [sys.executable, str(GRAFANA / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_dashboard_has_fixed_uid_and_datasource_job_instance_variables() -> None:
    doc = dashboard()
    assert doc["uid"] == "redisbus-overview"
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):
        var = variables[name]
        assert var["type"] == "query"
        assert var["definition"].startswith("label_values(")
        assert var["definition"].rstrip(")").endswith(name)
        assert var["includeAll"] and var["allValue"] == ".*"
        assert var["datasource"]["uid"] == "${datasource}"


def test_every_panel_has_a_title_a_description_and_the_datasource_variable() -> None:
    ids = [p["id"] for p in dashboard_panels()]
    assert len(ids) == len(set(ids))
    for panel in panels_with_queries():
        assert panel["title"].strip()
        assert len(panel.get("description", "")) >= 30, panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_every_range_in_the_dashboard_is_rate_interval() -> None:
    for panel in panels_with_queries():
        for t in panel["targets"]:
            expr = t["expr"]
            ranges = re.findall(r"\[([^\]]*)\]", expr)
            assert all(r == "$__rate_interval" for r in ranges), (panel["title"], expr)
            for fn in RANGE_FUNCS:
                for m in re.finditer(rf"\b{fn}\(", expr):
                    # the range function's argument ends with [$__rate_interval]
                    rest = expr[m.end() :]
                    assert "[$__rate_interval])" in rest, (panel["title"], expr)


def test_every_dashboard_selector_filters_on_job_and_instance() -> None:
    for panel in panels_with_queries():
        for t in panel["targets"]:
            selectors = re.findall(r"[a-z_:]+\{([^}]*)\}", t["expr"])
            assert selectors, t["expr"]
            for s in selectors:
                assert 'job=~"$job"' in s and 'instance=~"$instance"' in s, t["expr"]


def test_dashboard_covers_every_metric_and_reads_no_unknown_one() -> None:
    used: set[str] = set()
    for _, expr in dashboard_queries():
        used |= metric_names(expr)
    known = known_metric_names()
    assert used <= known, used - known
    bases = {re.sub(r"_(total|bucket|count|sum|created)$", "", n) for n in used}
    wanted = {
        re.sub(r"_(total|bucket|count|sum|created)$", "", n)
        for n in client_metric_names() | set(FLEET_COUNTERS)
    } | (set(FLEET_GAUGES) - NOT_ON_DASHBOARD)
    assert wanted <= bases, wanted - bases


def test_dashboard_has_the_panels_operators_look_for() -> None:
    titles = " | ".join(p["title"].lower() for p in panels_with_queries())
    for words in (
        "send rate by type",
        "refusals by reason",
        "delivery latency per host",
        "delivery latency, whole fleet",
        "unread backlog",
        "oldest unread",
        "pending",
        "redeliveries and dead-lettering",
        "agents by status",
        "receive and done",
        "channels",
    ):
        assert words in titles, words
    per_host = [
        t["expr"]
        for p in panels_with_queries()
        if "per host" in p["title"].lower()
        for t in p["targets"]
    ]
    for q in ("0.5", "0.95", "0.99"):
        assert any(
            f"histogram_quantile({q}, sum by (le, host) (rate({LATENCY_BUCKET}" in e
            for e in per_host
        ), q


def test_dashboard_queries_substitute_grafana_variables() -> None:
    queries = dashboard_queries()
    assert len(queries) >= 20
    for title, expr in queries:
        assert "$" not in expr, title
        assert "[1m]" in expr or not any(f"{fn}(" in expr for fn in RANGE_FUNCS), title


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard_folder() -> None:
    (ds,) = yaml_docs(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus"
    (dash,) = yaml_docs(GRAFANA / "provisioning" / "dashboards" / "redisbus.yml")
    (provider,) = dash["providers"]
    (compose,) = yaml_docs(DEPLOY / "docker-compose.yml")
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"../grafana/dashboards:{provider['options']['path']}:ro" in mounts


# --- docker compose ------------------------------------------------------------------------------

COMPOSE_ENV = {
    "REDISBUS_AGENT_PASSWORD": "test-only",
    "REDISBUS_EXPORTER_PASSWORD": "test-only",
    "GRAFANA_ADMIN_PASSWORD": "test-only",
}


def test_compose_file_validates_against_the_compose_schema() -> None:
    if shutil.which("docker-compose"):
        cmd = ["docker-compose"]
    elif (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        cmd = ["docker", "compose"]
    else:
        cmd = [require_tool("docker-compose")]
    env = {**os.environ, **COMPOSE_ENV}
    result = subprocess.run(
        [*cmd, "-f", "docker-compose.yml", "config", "-q"],
        cwd=DEPLOY,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_runs_redis_exporter_two_agent_hosts_prometheus_and_grafana() -> None:
    (doc,) = yaml_docs(DEPLOY / "docker-compose.yml")
    services = doc["services"]
    assert set(services) == {
        "redis",
        "exporter",
        "janitor",
        "agent-a",
        "agent-b",
        "prometheus",
        "grafana",
    }
    # the exporter's user is read-only: the janitor runs on its own, as the agent user
    assert services["exporter"]["environment"]["REDISBUS_JANITOR"] == "false"
    assert services["janitor"]["command"] == ["janitor"]
    assert services["janitor"]["environment"]["REDISBUS_USERNAME"] == "agent"
    redis_cmd = " ".join(services["redis"]["command"])
    for flag in (
        "--appendonly yes",
        "--appendfsync everysec",
        "--maxmemory-policy noeviction",
        "--aclfile",
        "/usr/local/etc/redis/redis.conf",
    ):
        assert flag in redis_cmd, flag
    assert services["redis"]["image"].startswith("redis:7")
    assert services["exporter"]["command"] == ["exporter"]
    hosts = {services[a]["environment"]["REDISBUS_HOST"] for a in ("agent-a", "agent-b")}
    assert hosts == {"host-a", "host-b"}
    for agent in ("agent-a", "agent-b"):
        assert services[agent]["entrypoint"] == ["python", "/app/agent_host.py"]
    assert "COPY deploy/agent_host.py" in (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    # every bind-mounted file exists, and published ports are on loopback only
    for name, svc in services.items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), (name, source)
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    assert (
        "./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in services["prometheus"]["volumes"]
    )
    assert "../grafana/provisioning:/etc/grafana/provisioning:ro" in services["grafana"]["volumes"]


def test_every_compose_service_has_a_healthcheck() -> None:
    (doc,) = yaml_docs(DEPLOY / "docker-compose.yml")
    for name, svc in doc["services"].items():
        check = svc.get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL"), name
        assert {"interval", "timeout", "retries"} <= set(check), name
    services = doc["services"]
    # the exporter's check is its liveness endpoint, not Redis: Redis has its own check
    assert any("/healthz" in part for part in services["exporter"]["healthcheck"]["test"])
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"


def test_compose_takes_passwords_from_the_environment_only() -> None:
    text = (DEPLOY / "docker-compose.yml").read_text(encoding="utf-8")
    for m in re.finditer(r"(PASSWORD\w*):\s*(\S+)", text):
        assert m.group(2).startswith("${"), m.group(0)


def test_prometheus_scrapes_the_compose_services_on_their_ports() -> None:
    (compose,) = yaml_docs(DEPLOY / "docker-compose.yml")
    (prom,) = yaml_docs(PROM_DIR / "prometheus.yml")
    jobs = {
        c["job_name"]: [t for sc in c["static_configs"] for t in sc["targets"]]
        for c in prom["scrape_configs"]
    }
    services = compose["services"]
    exporter_port = services["exporter"]["environment"]["REDISBUS_EXPORTER_PORT"]
    assert jobs["redisbus-exporter"] == [f"exporter:{exporter_port}"]
    assert sorted(jobs["redisbus-agents"]) == sorted(
        f"{a}:{services[a]['environment']['REDISBUS_METRICS_PORT']}" for a in ("agent-a", "agent-b")
    )


# --- Redis config and ACL ------------------------------------------------------------------------


def redis_directives(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            out[key] = value.strip()
    return out


def test_redis_conf_keeps_every_message() -> None:
    text = (REDIS_DIR / "redis.conf").read_text(encoding="utf-8")
    conf = redis_directives(text)
    assert conf["appendonly"] == "yes"
    assert conf["appendfsync"] == "everysec"
    assert conf["maxmemory-policy"] == "noeviction"
    assert conf["aclfile"] == "/usr/local/etc/redis/users.acl"
    assert "appendfsync always" in text  # the comment explaining the stricter choice


def test_committed_acl_holds_placeholders_only() -> None:
    lines = (REDIS_DIR / "users.acl").read_text(encoding="utf-8").splitlines()
    users = {line.split()[1]: line for line in lines}
    assert set(users) == {"default", "agent", "exporter"}
    # off and without a password (nobody logs in as it), yet with every permission: Redis 7
    # replays the AOF as the default user and re-checks it at each EXEC (docs/deployment.md#redis)
    default = users["default"].split()
    assert {"off", "resetpass", "~*", "+@all"} <= set(default)
    assert not {"on", "nopass"} & set(default)
    assert not [t for t in default if t.startswith((">", "#", "-"))], default
    for name in ("agent", "exporter"):
        hashes = re.findall(r"#[0-9a-f]{64}", users[name])
        assert hashes == [PLACEHOLDER_HASH], name
        assert ">" not in users[name], "no plaintext passwords"
        assert "~rb:*" in users[name] and "-@all" in users[name]


# --- Kubernetes ----------------------------------------------------------------------------------


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted(K8S.glob("*.yaml"))
        for doc in yaml_docs(path)
        if doc.get("kind") != "Kustomization"
    ]


def test_kubernetes_manifests_validate_against_the_api_schemas() -> None:
    kv = require_module("kubernetes_validate")
    docs = k8s_documents()
    assert {d["kind"] for _, d in docs} >= {
        "Namespace",
        "StatefulSet",
        "Service",
        "Deployment",
        "ConfigMap",
    }
    for name, doc in docs:
        try:
            kv.validate(doc, "1.30.0", strict=True)
        except kv.ValidationError as e:
            pytest.fail(f"{name} {doc['kind']}/{doc['metadata']['name']}: {e}")


def pod_specs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"])
        for _, doc in k8s_documents()
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
    ]


def test_every_pod_meets_pod_security_restricted() -> None:
    (namespace,) = [d for _, d in k8s_documents() if d["kind"] == "Namespace"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    specs = pod_specs()
    assert {name for name, _ in specs} == {
        "StatefulSet/redis",
        "Deployment/redisbus-exporter",
        "Deployment/redisbus-janitor",
    }
    for name, spec in specs:
        pod = spec.get("securityContext", {})
        assert pod.get("runAsNonRoot") is True, name
        assert pod.get("seccompProfile") == {"type": "RuntimeDefault"}, name
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert sc.get("seccompProfile", pod["seccompProfile"]) == {"type": "RuntimeDefault"}
            assert not sc.get("privileged", False), (name, c["name"])


def test_exporter_probes_are_split_and_its_service_keeps_it_scraped_when_not_ready() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in k8s_documents()}
    deployment = docs[("Deployment", "redisbus-exporter")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # liveness is the process, readiness follows Redis: an outage restarts nothing
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["REDISBUS_USERNAME"] == "exporter" and env["REDISBUS_JANITOR"] == "false"
    assert docs[("Service", "redisbus-exporter")]["spec"]["publishNotReadyAddresses"] is True


def test_janitor_runs_under_the_agent_user() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in k8s_documents()}
    deployment = docs[("Deployment", "redisbus-janitor")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["janitor"]
    assert container["envFrom"] == [{"configMapRef": {"name": "redisbus-config"}}]
    env = {e["name"]: e for e in container["env"]}
    assert env["REDISBUS_USERNAME"]["value"] == "agent"
    secret = env["REDISBUS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert secret == {"name": "redisbus-agent-credentials", "key": "REDISBUS_PASSWORD"}
    assert float(env["REDISBUS_JANITOR_INTERVAL_S"]["value"]) > 0


# --- the Prometheus operator: ServiceMonitor and PrometheusRule ----------------------------------

OPERATOR = K8S / "prometheus-operator"


def crd_validator(kind: str) -> Any:
    jsonschema = require_module("jsonschema")
    schema = json.loads((OPERATOR / "schemas" / f"{kind.lower()}.v1.json").read_text("utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def operator_documents() -> dict[str, dict[str, Any]]:
    return {
        doc["kind"]: doc
        for path in sorted(OPERATOR.glob("*.yaml"))
        for doc in yaml_docs(path)
        if doc.get("kind") != "Kustomization"
    }


def test_servicemonitor_and_prometheusrule_validate_against_their_crd_schemas() -> None:
    docs = operator_documents()
    assert set(docs) == {"ServiceMonitor", "PrometheusRule"}
    for kind, doc in docs.items():
        errors = [e.message for e in crd_validator(kind).iter_errors(doc)]
        assert errors == [], (kind, errors)
    (kust,) = yaml_docs(OPERATOR / "kustomization.yaml")
    assert sorted(kust["resources"]) == ["prometheusrule.yaml", "servicemonitor.yaml"]


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("ServiceMonitor", ("spec", "endpoints", 0, "interval"), "15 seconds"),
        ("ServiceMonitor", ("spec", "endpoints", 0, "prot"), "metrics"),
        ("ServiceMonitor", ("spec", "endpoints", 0, "scheme"), "ftp"),
        ("ServiceMonitor", ("spec", "selector", "matchLabel"), {"a": "b"}),
        ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "for"), "2 minutes"),
        ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "labels"), {"severity": 1}),
        ("PrometheusRule", ("spec", "groups", 0, "rule"), []),
    ],
)
def test_the_crd_schemas_refuse_what_the_operator_would(
    kind: str, path: tuple[str | int, ...], value: Any
) -> None:
    # given a valid manifest with one field made wrong (a typo, a bad duration, a bad type)
    doc = json.loads(json.dumps(operator_documents()[kind]))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    # then validation refuses it
    assert list(crd_validator(kind).iter_errors(doc)), (kind, path)


def test_prometheusrule_carries_exactly_the_unit_tested_rules() -> None:
    result = subprocess.run(
        [sys.executable, str(PROM_DIR / "render_prometheusrule.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    (alerts,) = yaml_docs(PROM_DIR / "alerts.yml")
    assert operator_documents()["PrometheusRule"]["spec"]["groups"] == alerts["groups"]


def test_servicemonitor_scrapes_the_exporter_service_as_job_redisbus_exporter() -> None:
    monitor = operator_documents()["ServiceMonitor"]
    docs = {(d["kind"], d["metadata"]["name"]): d for _, d in k8s_documents()}
    service = docs[("Service", "redisbus-exporter")]
    labels = service["metadata"]["labels"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    (relabel,) = endpoint["relabelings"]
    assert (relabel["targetLabel"], relabel["replacement"]) == ("job", "redisbus-exporter")


def test_kustomization_lists_every_manifest() -> None:
    (kust,) = yaml_docs(K8S / "kustomization.yaml")
    assert sorted(kust["resources"]) == sorted(
        p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"
    )


def test_kubernetes_redis_config_is_the_same_file() -> None:
    (config,) = [d for _, d in k8s_documents() if d["metadata"]["name"] == "redis-config"]
    assert config["data"]["redis.conf"] == (REDIS_DIR / "redis.conf").read_text(encoding="utf-8")


def test_kubernetes_exporter_takes_settings_from_redisbus_env() -> None:
    docs = dict(((d["kind"], d["metadata"]["name"]), d) for _, d in k8s_documents())
    settings = docs[("ConfigMap", "redisbus-config")]["data"]
    assert all(k.startswith("REDISBUS_") for k in settings)
    deployment = docs[("Deployment", "redisbus-exporter")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["exporter"]
    assert container["envFrom"] == [{"configMapRef": {"name": "redisbus-config"}}]
    env = {e["name"]: e for e in container["env"]}
    assert "secretKeyRef" in env["REDISBUS_PASSWORD"]["valueFrom"]
    port = int(settings["REDISBUS_EXPORTER_PORT"])
    assert container["ports"][0]["containerPort"] == port
    assert not any(d["kind"] == "Secret" for _, d in k8s_documents())


def test_committed_deploy_files_hold_no_machine_paths() -> None:
    files = [p for p in (*DEPLOY.rglob("*"), *GRAFANA.rglob("*")) if p.is_file()]
    for path in files:
        if path.suffix in {".pyc"}:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for bad in ("/work/", "/tmp/", "/root/", "/home/"):
            assert bad not in text, (path.name, bad)


# Variables that are not BusSettings fields: the exporter's options (redisbus.exporter's
# ExporterSettings) and deploy/agent_host.py's.
NON_BUS_SETTINGS = {
    "REDISBUS_JANITOR",
    "REDISBUS_JANITOR_INTERVAL_S",
    "REDISBUS_EXPORTER_PORT",
    "REDISBUS_EXPORTER_TOP_N",
    "REDISBUS_WATCHDOG_STALE_S",
    "REDISBUS_METRICS_PORT",
    "REDISBUS_METRICS_ADDR",
    "REDISBUS_DEMO_READ_INTERVAL_S",
    "REDISBUS_DEMO_CHANNEL",
}


def test_every_redisbus_variable_in_the_manifests_is_a_setting() -> None:
    from redisbus import BusSettings

    fields = {f"REDISBUS_{name.upper()}" for name in BusSettings.model_fields}
    texts = [
        (DEPLOY / "docker-compose.yml").read_text(encoding="utf-8"),
        (DEPLOY / "agent_host.py").read_text(encoding="utf-8"),
        *(p.read_text(encoding="utf-8") for p in K8S.glob("*.yaml")),
    ]
    used = {v for text in texts for v in re.findall(r"\bREDISBUS_[A-Z_]+[A-Z]\b", text)}
    # passwords handed to the Redis container to render the ACL are not client settings
    used -= {"REDISBUS_AGENT_PASSWORD", "REDISBUS_EXPORTER_PASSWORD"}
    assert used - fields <= NON_BUS_SETTINGS, used - fields - NON_BUS_SETTINGS


def test_scripts_parse_and_ensure_prometheus_is_a_no_op_once_installed() -> None:
    scripts = sorted((ROOT / "scripts").glob("*.sh"))
    assert {p.name for p in scripts} >= {"ensure-prometheus.sh", "ensure-tools.sh"}
    for path in [*scripts, REDIS_DIR / "render-acl.sh"]:
        shell = "sh" if path.name == "render-acl.sh" else "bash"  # the redis image has no bash
        result = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, (path.name, result.stderr)
    require_tool("promtool")
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ensure-prometheus.sh")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("prometheus: prometheus, version")


def test_client_and_fleet_metric_names_pass_promtool_lint() -> None:
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

    from redisbus.metrics import BusMetrics

    registry = CollectorRegistry()
    BusMetrics(registry, host="host-a").delivered(0.01)
    for name, labels in FLEET_GAUGES.items():
        if name != "redisbus_build_info":  # the agent hosts' own, registered above
            Gauge(name, f"fleet gauge {name}", labels, registry=registry)
    for name, labels in FLEET_COUNTERS.items():
        Counter(name, f"fleet counter {name}", labels, registry=registry)
    result = subprocess.run(
        [require_tool("promtool"), "check", "metrics"],
        input=generate_latest(registry).decode(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
