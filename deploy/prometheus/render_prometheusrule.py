"""Write deploy/k8s/prometheus-operator/prometheusrule.yaml from alerts.yml.

The PrometheusRule carries exactly the groups of alerts.yml, so the rules that promtool
unit-tests are the rules the operator loads. Run it after changing alerts.yml
(``--check`` exits 1 when the committed file is stale; the tests run it that way)::

    python deploy/prometheus/render_prometheusrule.py [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ALERTS = HERE / "alerts.yml"
OUT = HERE.parent / "k8s" / "prometheus-operator" / "prometheusrule.yaml"

HEADER = """\
# Generated from deploy/prometheus/alerts.yml by deploy/prometheus/render_prometheusrule.py:
# edit alerts.yml (and its unit tests, alerts_test.yml), then run the script.
# For the Prometheus operator; label it so that your Prometheus' ruleSelector selects it.
"""


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> Any:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render() -> str:
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "redisbus",
            "namespace": "redisbus",
            "labels": {"app.kubernetes.io/part-of": "redisbus"},
        },
        "spec": {"groups": rules["groups"]},
    }
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    return HEADER + body


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT.name} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
