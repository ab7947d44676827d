"""The monitoring against a real Prometheus (docs/monitoring.md), on a lab of its own: deploy ct200's DDTREE
service, run playbooks/monitoring.yml (Debian's Prometheus on ct200, scraping its services), then

- every query of the Grafana dashboard returns series from that Prometheus;
- with traffic and no fault, the acceptance length is above the alert's floor and nothing fires;
- a planted fault (LAB_RUNTIME_FAULT=accept_collapse in the unit's environment file, then a restart: the drafter
  no longer fits the traffic; acceptance falls toward 1, the output is unchanged) makes the real Prometheus fire
  SGLangSpecAcceptLengthCollapsed for ct200's coder, with its labels.

A stage of its own (`scripts/test monitoring`, a few minutes on two cores). What it saw goes to
.cache/gitops-artifacts/monitoring.json.
"""

import json
import os
import shutil
import time
from urllib.parse import quote

import pytest
from conftest import ARTIFACTS, REPO, on_lab_host, run

pytestmark = [
    pytest.mark.skipif(
        shutil.which("podman") is None, reason="needs podman and the controller venv (scripts/test monitoring)"
    ),
    pytest.mark.skipif(
        not os.environ.get("DDTREE_TEST_MONITORING"), reason="a stage of its own: scripts/test monitoring"
    ),
]

HOST = "ct200"
SERVICE = "coder"
PROMETHEUS = "http://127.0.0.1:9090"
DASHBOARD = REPO / "roles" / "sglang_monitoring" / "files" / "sglang-dashboard.json"
ENV_FILE = "/etc/sglang/%s.env" % SERVICE
ALERT = "SGLangSpecAcceptLengthCollapsed"
SEEN = {}

# Run inside the lab host (the containers have no network): GET or POST a URL on its loopback, print the JSON.
HTTP = """
import json, sys, urllib.parse, urllib.request
url, body = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
data = body.encode() if body else None
request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
print(urllib.request.urlopen(request, timeout=120).read().decode())
"""


@pytest.fixture(scope="module")
def lab():
    env = dict(
        os.environ,
        DDTREE_LAB_ID="ddtree-monitoring-%d-%d" % (int(time.time()), os.getpid()),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
    )
    try:
        run([str(REPO / "lab" / "run"), "ansible-playbook", "site.yml", "-l", "blackwell"], env)
        proc = run([str(REPO / "lab" / "run"), "ansible-playbook", "playbooks/monitoring.yml", "-l", HOST], env)
        SEEN["monitoring_play_recap"] = proc.stdout.split("PLAY RECAP", 1)[-1].strip()
        yield env
    finally:
        run([str(REPO / "lab" / "down")], env, check=False)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "monitoring.json").write_text(json.dumps(SEEN, indent=2) + "\n")


def http(env, url, body=None):
    return json.loads(on_lab_host(env, HOST, "python3", "-c", HTTP, url, *([json.dumps(body)] if body else [])))


def query(env, promql):
    answer = http(env, "%s/api/v1/query?query=%s" % (PROMETHEUS, quote(promql)))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def generate(env, tokens=64):
    """One greedy request to the service: traffic for its decode windows."""
    prompt = "def fibonacci(n):\n    "
    return http(
        env,
        "http://127.0.0.1:30000/generate",
        {"text": prompt, "sampling_params": {"max_new_tokens": tokens, "temperature": 0}},
    )


def wait_for(condition, timeout_s, step_s=3, traffic=None):
    deadline = time.monotonic() + timeout_s
    while True:
        if traffic:
            traffic()
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step_s)


def alerts(env, name=ALERT):
    answer = http(env, PROMETHEUS + "/api/v1/alerts")
    return [alert for alert in answer["data"]["alerts"] if alert["labels"].get("alertname") == name]


def test_1_prometheus_scrapes_the_service_with_the_inventorys_labels(lab):
    up = wait_for(lambda: query(lab, 'up{job="sglang"} == 1'), 60)
    assert len(up) == 1, up
    labels = up[0]["metric"]
    SEEN["target_labels"] = labels
    release = on_lab_host(lab, HOST, "readlink", "/opt/sglang/services/%s/current" % SERVICE)
    assert labels["host"] == HOST and labels["service"] == SERVICE and labels["algorithm"] == "DDTREE"
    assert labels["release_id"] == os.path.basename(release)


def test_2_every_dashboard_query_returns_series(lab):
    generate(lab)
    time.sleep(12)  # two scrapes more: the rates have two points
    empty = []
    answered = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            result = query(lab, target["expr"])
            answered[target["expr"]] = len(result)
            if not result:
                empty.append("%s: %s" % (panel["title"], target["expr"]))
    SEEN["dashboard_series"] = answered
    assert not empty, "dashboard queries without series from the lab's Prometheus:\n" + "\n".join(empty)


def accept_length(env):
    result = query(env, 'sglang:spec_accept_length{job="sglang", service="%s"}' % SERVICE)
    return float(result[0]["value"][1]) if result else 0.0


def test_3_without_a_fault_the_acceptance_is_above_its_floor_and_nothing_fires(lab):
    healthy = wait_for(lambda: accept_length(lab) > 0, 120, traffic=lambda: generate(lab))
    SEEN["accept_length_before"] = accept_length(lab)
    floor = float(query(lab, "ddtree:spec_accept_length_floor")[0]["value"][1])
    assert healthy and SEEN["accept_length_before"] > floor, (SEEN["accept_length_before"], floor)
    assert alerts(lab) == []


def test_4_a_planted_acceptance_collapse_fires_the_alert(lab):
    before = generate(lab, 32)["text"]
    on_lab_host(lab, HOST, "sh", "-c", "echo LAB_RUNTIME_FAULT=accept_collapse >> %s" % ENV_FILE)
    on_lab_host(lab, HOST, "systemctl", "restart", "sglang-%s.service" % SERVICE)
    assert wait_for(
        lambda: on_lab_host(lab, HOST, "python3", "-c", HTTP, "http://127.0.0.1:30000/v1/models", check=False), 120
    )
    SEEN["fault"] = on_lab_host(lab, HOST, "grep", "LAB_RUNTIME_FAULT", ENV_FILE)
    # The output stays the same (verification is lossless): only the speed tells.
    assert generate(lab, 32)["text"] == before
    started = time.monotonic()
    firing = wait_for(
        lambda: [alert for alert in alerts(lab) if alert["state"] == "firing"], 300, traffic=lambda: generate(lab)
    )
    SEEN["seconds_to_firing"] = round(time.monotonic() - started, 1)
    SEEN["accept_length_after"] = accept_length(lab)
    SEEN["alert"] = firing
    print(json.dumps({"alert": firing, "seconds_to_firing": SEEN["seconds_to_firing"]}, indent=2))
    assert firing, "no %s fired in 300 s; accept length %s" % (ALERT, SEEN["accept_length_after"])
    labels = firing[0]["labels"]
    assert (labels["host"], labels["service"], labels["algorithm"]) == (HOST, SERVICE, "DDTREE")
    assert float(firing[0]["value"]) < 1.3 and SEEN["accept_length_after"] < 1.3
