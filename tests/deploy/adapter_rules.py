"""The prometheus-adapter rules shipped by the chart, and how the adapter turns them into PromQL.

Source of truth: charts/ferry/files/prometheus-adapter-rules.yaml. `promql` expands a rule's
metricsQuery the way prometheus-adapter does for a Pods metric request (`<<.Series>>`,
`<<.LabelMatchers>>` -> `namespace="ns",pod=~"a|b"`, `<<.GroupBy>>` -> `pod`), so
test_prometheus_queue_metric.py evaluates exactly the query an HPA would trigger.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_RULES = ROOT / "charts" / "ferry" / "files" / "prometheus-adapter-rules.yaml"
ADAPTER_VALUES = ROOT / "deploy" / "prometheus" / "adapter-values.yaml"


@dataclass(frozen=True)
class AdapterRule:
    """One custom-metrics rule: the series it discovers and the metric it serves."""

    series_query: str
    series: str
    metric_name: str
    metrics_query: str

    def promql(self, namespace: str, pods: list[str]) -> str:
        """The PromQL prometheus-adapter sends for `pods/*/<metric>` in `namespace`."""
        if not pods:
            raise ValueError("prometheus-adapter never queries an empty pod list")
        matchers = f'namespace="{namespace}",pod=~"{"|".join(pods)}"'
        return (self.metrics_query.replace("<<.Series>>", self.series)
                .replace("<<.LabelMatchers>>", matchers)
                .replace("<<.GroupBy>>", "pod"))


def load_rules(path: Path = CHART_RULES) -> dict[str, AdapterRule]:
    """Rules by served metric name, from an adapter config (`rules:`) file."""
    return parse_rules(yaml.safe_load(path.read_text())["rules"])


def parse_rules(raw: list[dict[str, object]]) -> dict[str, AdapterRule]:
    rules: dict[str, AdapterRule] = {}
    for item in raw:
        name = item["name"]
        assert isinstance(name, dict), f"rule name must be a mapping, got {name!r}"
        rule = AdapterRule(
            series_query=str(item["seriesQuery"]),
            series=str(name["matches"]),
            metric_name=str(name["as"]),
            metrics_query=str(item["metricsQuery"]),
        )
        rules[rule.metric_name] = rule
    return rules
