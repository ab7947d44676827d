"""The monitoring's rules and dashboard with the real promtool (Debian's prometheus package, scripts/promtool):
`promtool check rules` on the shipped rules and on the gate's records as monitoring_targets writes them, and
`promtool test rules` (tests/monitoring/sglang.rules.test.yml), which has a case for every alert."""

import json
import shutil
import subprocess

import pytest
import yaml
from conftest import REPO_ROOT

from ansible_collections.ddtree.sglang.plugins.module_utils.monitoring import gate_records

ROLE = REPO_ROOT / "roles" / "sglang_monitoring"
RULES = ROLE / "files" / "sglang.rules.yml"
DASHBOARD = ROLE / "files" / "sglang-dashboard.json"
TESTS = REPO_ROOT / "tests" / "monitoring" / "sglang.rules.test.yml"
PROMTOOL = REPO_ROOT / "scripts" / "promtool"

# What the promtool test's gate records are made from: ct200's DDTREE coder passed its gate at 40 tokens/s on
# release r1; ct129's plain chat runs release r2, whose gate found degenerate output.
HOSTS = {
    "ct200": [{"name": "coder", "port": 30000, "speculative": {"algorithm": "DDTREE", "budget": 15}}],
    "ct129": [{"name": "chat", "port": 30001}],
}
STATUS = {
    "ct200": {
        "coder": {"release_id": "r1", "verdict": {"verdict": "passed", "measurements": {"tokens_per_second": 40}}}
    },
    "ct129": {"chat": {"release_id": "r2", "verdict": {"verdict": "failed", "failure_kind": "degenerate"}}},
}


@pytest.fixture(scope="module")
def promtool():
    if shutil.which("apt-get") is None:
        pytest.skip("scripts/promtool takes promtool from Debian's prometheus package: needs apt")
    return str(PROMTOOL)


def run(*argv, cwd=REPO_ROOT):
    proc = subprocess.run(argv, cwd=cwd, text=True, capture_output=True, timeout=300, check=False)
    print(proc.stdout, proc.stderr)
    return proc


def alerts():
    return [
        rule["alert"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def test_promtool_checks_the_shipped_rules(promtool):
    proc = run(promtool, "check", "rules", str(RULES))
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stderr


def test_promtool_checks_the_gate_records_as_written(promtool, tmp_path):
    records = tmp_path / "gate-records.rules.yml"
    records.write_text(json.dumps(gate_records(HOSTS, STATUS, 0.5, 1.3)))
    proc = run(promtool, "check", "rules", str(records))
    assert proc.returncode == 0 and "SUCCESS: 5 rules found" in proc.stdout, proc.stdout + proc.stderr


def test_promtool_tests_every_alert(promtool, tmp_path):
    shutil.copy(RULES, tmp_path / "sglang.rules.yml")
    shutil.copy(TESTS, tmp_path / "sglang.rules.test.yml")
    (tmp_path / "gate-records.rules.yml").write_text(json.dumps(gate_records(HOSTS, STATUS, 0.5, 1.3)))
    proc = run(promtool, "test", "rules", "sglang.rules.test.yml", cwd=tmp_path)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr
    tested = {
        check["alertname"]
        for case in yaml.safe_load(TESTS.read_text())["tests"]
        for check in case.get("alert_rule_test", [])
    }
    assert tested == set(alerts()), "alerts without a promtool test case: %s" % sorted(set(alerts()) - tested)
    # Each alert is expected to fire in its case (not only to stay silent).
    fired = {
        check["alertname"]
        for case in yaml.safe_load(TESTS.read_text())["tests"]
        for check in case.get("alert_rule_test", [])
        if check.get("exp_alerts")
    }
    assert fired == set(alerts())


def test_promtool_test_fails_when_an_alert_breaks(promtool, tmp_path):
    """The test can fail: an acceptance floor the lab's collapse never goes under leaves the alert silent."""
    shutil.copy(RULES, tmp_path / "sglang.rules.yml")
    shutil.copy(TESTS, tmp_path / "sglang.rules.test.yml")
    (tmp_path / "gate-records.rules.yml").write_text(json.dumps(gate_records(HOSTS, STATUS, 0.5, 1.0)))
    proc = run(promtool, "test", "rules", "sglang.rules.test.yml", cwd=tmp_path)
    assert proc.returncode != 0 and "SGLangSpecAcceptLengthCollapsed" in proc.stdout + proc.stderr


def test_the_dashboard_reads_only_series_the_rules_or_sglang_make():
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert queries and all('job="sglang"' in query or "ddtree:" in query for query in queries), queries


def test_promtool_parses_every_dashboard_query(promtool, tmp_path):
    """Each panel's query as a recording rule: promtool check rules parses its PromQL (the lab test runs them)."""
    queries = [target["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for target in panel["targets"]]
    rules = [{"record": "dashboard:query_%d" % index, "expr": query} for index, query in enumerate(queries)]
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = run(promtool, "check", "rules", str(path))
    assert proc.returncode == 0 and "SUCCESS: %d rules found" % len(queries) in proc.stdout, proc.stdout + proc.stderr
