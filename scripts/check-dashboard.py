#!/usr/bin/env python3
"""Checks Grafana dashboard JSON files against the grafana-foundation-sdk's Dashboard model.

Each file is parsed into `models.dashboard.Dashboard` (panels through the registered panel
plugins' options and field-config models, targets through the Prometheus query model) and
encoded back. `from_json` ignores keys it does not know, so every key and value of the file must
come back unchanged: a misspelt option, a field at the wrong level or a wrong type shows up as a
difference. It also requires every panel type and query to be one the SDK knows (no
`UnknownDataquery`), Prometheus as every panel's datasource, and unique panel ids.

Usage: check-dashboard.py FILE...   (exit 1 and one line per problem when any is found)
"""
import json
import sys

from grafana_foundation_sdk.cog import plugins, runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard, prometheus


def differences(original, parsed, path):
    """Every place where `original` is not found unchanged in `parsed` (extra defaults are fine)."""
    if isinstance(original, dict):
        if not isinstance(parsed, dict):
            return [f"{path}: {type(parsed).__name__} after parsing, not an object"]
        out = []
        for k, v in original.items():
            if k not in parsed:
                out.append(f"{path}.{k}: not in the schema (dropped when parsed)")
            else:
                out.extend(differences(v, parsed[k], f"{path}.{k}"))
        return out
    if isinstance(original, list):
        if not isinstance(parsed, list) or len(parsed) != len(original):
            return [f"{path}: list changed when parsed"]
        return [d for i, (a, b) in enumerate(zip(original, parsed)) for d in differences(a, b, f"{path}[{i}]")]
    if original != parsed or type(original) is not type(parsed) and not isinstance(original, (int, float)):
        return [f"{path}: {original!r} became {parsed!r}"]
    return []


def check(path):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    problems = []
    dash = dashboard.Dashboard.from_json(data)
    again = json.loads(json.dumps(dash, cls=JSONEncoder))
    problems += differences(data, again, "$")
    if not dash.uid or not dash.title:
        problems.append("$: uid and title are required")
    if dash.schema_version < 39:
        problems.append(f"$.schemaVersion: {dash.schema_version} < 39")
    ids = set()

    def panel(p, where):
        if p.id_val in ids:
            problems.append(f"{where}: panel id {p.id_val} is used twice")
        ids.add(p.id_val)
        if isinstance(p, dashboard.RowPanel):
            for i, q in enumerate(p.panels or []):
                panel(q, f"{where}.panels[{i}]")
            return
        if runtime.panelcfg_config(p.type_val) is None:
            problems.append(f"{where}: panel type {p.type_val!r} is not a Grafana panel the SDK knows")
        if p.datasource is None or p.datasource.type_val != "prometheus":
            problems.append(f"{where} ({p.title}): datasource is not Prometheus")
        if not p.targets:
            problems.append(f"{where} ({p.title}): no queries")
        for j, t in enumerate(p.targets or []):
            if not isinstance(t, prometheus.Dataquery):
                problems.append(f"{where}.targets[{j}]: not a Prometheus query")
            elif not t.expr or not t.ref_id:
                problems.append(f"{where}.targets[{j}]: expr and refId are required")

    for i, p in enumerate(dash.panels or []):
        panel(p, f"$.panels[{i}]")
    return problems


def main():
    plugins.register_default_plugins()
    bad = 0
    for path in sys.argv[1:]:
        problems = check(path)
        for p in problems:
            print(f"{path}: {p}")
        bad += len(problems)
        if not problems:
            print(f"{path}: ok")
    sys.exit(1 if bad or len(sys.argv) < 2 else 0)


if __name__ == "__main__":
    main()
