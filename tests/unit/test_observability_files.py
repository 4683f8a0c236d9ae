"""The metrics table, the Prometheus files and the Grafana dashboard agree with the module.

- ``docs/metrics.md`` is exactly what ``memstream.metrics`` declares;
- ``promtool`` (Debian's ``prometheus`` package) accepts the scrape config and the rules,
  and parses every dashboard query;
- every PromQL expression names only catalogued metrics (or the rules' own records).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from memstream.metrics import DOC_PATH, catalogue, catalogue_markdown

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "memstream.json"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)"
)

# PromQL words that are not metric names.
PROMQL_WORDS = frozenset(
    re.findall(
        r"\w+",
        """
        sum min max avg group stddev stdvar count count_values bottomk topk quantile
        by without on ignoring group_left group_right bool offset and or unless
        rate irate increase delta idelta deriv histogram_quantile abs ceil floor round
        clamp clamp_min clamp_max label_replace label_join vector scalar time timestamp
        sort sort_desc absent absent_over_time avg_over_time max_over_time min_over_time
        sum_over_time count_over_time last_over_time predict_linear changes resets inf nan
        """,
    )
)
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def catalogued_series() -> set[str]:
    names: set[str] = {"up"}
    for doc in catalogue():
        names.add(doc.name)
        if doc.type == "histogram":
            names.update(doc.name + s for s in HISTOGRAM_SUFFIXES)
    return names


def metric_names(expr: str) -> set[str]:
    """Metric (or recording-rule) names in a PromQL expression."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors and subqueries
    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text
    )  # grouping label lists
    text = re.sub(r"\boffset\s+\w+", "", text)
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables
    text = re.sub(r"(?<![\w:])\d+(?:\.\d*)?(?:[eE][+-]?\d+)?", "", text)  # numbers
    names = set()
    for word in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        if word.lower() in PROMQL_WORDS or re.fullmatch(r"\d+[smhdwy]", word):
            continue
        names.add(word)
    return names


def rules() -> dict[str, Any]:
    return yaml.safe_load((PROMETHEUS / "rules.yml").read_text())


def recorded_names() -> set[str]:
    return {r["record"] for g in rules()["groups"] for r in g["rules"] if "record" in r}


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in board["panels"] for t in p.get("targets", []) if "expr" in t]


def grafana_to_promql(expr: str) -> str:
    """Substitute Grafana's variables so that promtool can parse a dashboard query."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


# -- the table --------------------------------------------------------------------------


def test_metrics_table_matches_the_module() -> None:
    assert DOC_PATH.read_text() == catalogue_markdown(), (
        "docs/metrics.md is stale: python -m memstream.metrics > docs/metrics.md"
    )


def test_every_metric_is_namespaced_and_documented() -> None:
    docs = catalogue()
    assert len({d.name for d in docs}) == len(docs)
    for d in docs:
        assert d.name.startswith("memstream_"), d.name
        assert d.meaning.strip()
        assert d.unit
        if d.type == "counter":
            assert d.name.endswith("_total"), d.name


def test_metric_name_extraction() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, stage) (rate(memstream_stage_latency_seconds_bucket"
        '{stage=~"$stage"}[5m]))) / on(stage) group_left memstream_users offset 1h'
    )
    assert metric_names(expr) == {"memstream_stage_latency_seconds_bucket", "memstream_users"}


# -- Prometheus -------------------------------------------------------------------------


@needs_promtool
def test_promtool_accepts_the_rules() -> None:
    done = subprocess.run(
        ["promtool", "check", "rules", str(PROMETHEUS / "rules.yml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_promtool_accepts_the_scrape_config() -> None:
    done = subprocess.run(
        ["promtool", "check", "config", str(PROMETHEUS / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_rules_name_only_catalogued_metrics() -> None:
    known = catalogued_series() | recorded_names()
    alerts = set()
    for group in rules()["groups"]:
        for rule in group["rules"]:
            unknown = metric_names(rule["expr"]) - known
            assert not unknown, f"{rule.get('alert') or rule.get('record')}: {unknown}"
            alerts.add(rule.get("alert"))
    # the alerts operators were promised
    assert {
        "MemstreamProcessDown",
        "MemstreamConsumerLagGrowing",
        "MemstreamDeadLettersHigh",
        "MemstreamRetrievalP99OverObjective",
        "MemstreamConsolidationErrors",
    } <= alerts


def test_scrape_config_covers_every_process() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs == {"memstream-worker", "memstream-consolidator", "memstream-serve"}


# -- Grafana ----------------------------------------------------------------------------


def test_dashboard_names_only_catalogued_metrics() -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    known = catalogued_series() | recorded_names()
    for expr in exprs:
        names = metric_names(expr)
        assert names, expr
        assert not names - known, f"{expr}: {names - known}"


def test_dashboard_shows_what_operators_watch() -> None:
    board = json.loads(DASHBOARD.read_text())
    titles = " | ".join(p["title"].lower() for p in board["panels"])
    for topic in (
        "ingest",
        "lag",
        "stage latency",
        "dead letters",
        "consolidations",
        "cost",
        "retrieval latency",
        "errors",
    ):
        assert topic in titles, topic
    stage_quantiles = [e for e in dashboard_exprs() if "memstream_stage_latency_seconds" in e]
    assert {q for q in ("0.5", "0.95", "0.99") if any(f"({q}," in e for e in stage_quantiles)} == {
        "0.5",
        "0.95",
        "0.99",
    }
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_uses_the_provisioned_datasource() -> None:
    sources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())
    uids = {d["uid"] for d in sources["datasources"] if d["type"] == "prometheus"}
    board = json.loads(DASHBOARD.read_text())
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] in uids, panel["title"]
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/memstream.yaml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


@needs_promtool
def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    records = [
        {"record": f"memstream:dashboard_query_{i}", "expr": grafana_to_promql(e)}
        for i, e in enumerate(dashboard_exprs())
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    done = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stdout + done.stderr
