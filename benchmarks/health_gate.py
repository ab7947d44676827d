"""See benchmarks/health-gate. Faults are injected with a systemd drop-in (LAB_RUNTIME_FAULT) on
ct200's coder service; "going back" removes the drop-in and restarts, as a rollback to a good
release does."""

import json
import os
import subprocess
import sys
import threading
import time

LAB_ID = os.environ["DDTREE_LAB_ID"]
HOST = "ct200"
CONTAINER = "%s-%s" % (LAB_ID, HOST)
UNIT = "sglang-coder.service"
PORT = 30000
NAIVE_LIMIT = 600.0  # what the naive gate would wait
NAIVE_WATCH = 60.0  # how long this benchmark watches it while the fault is active
FAULTS = {
    "crash at start": "crash_at_start",
    "bad flag": "bad_flag",
    "hang after start": "hang",
    "degenerate output": "degenerate",
    "too slow": "slow:150",
    "crash after requests": "crash_after:2",
}


def sh(*args, check=True):
    return subprocess.run(["podman", "exec", CONTAINER, *args], capture_output=True, text=True, check=check)


def set_fault(value):
    dropin = "/etc/systemd/system/%s.d" % UNIT
    if value:
        sh("mkdir", "-p", dropin)
        sh(
            "sh",
            "-c",
            "printf '[Service]\\nEnvironment=LAB_RUNTIME_FAULT=%s\\n' > %s/bench-fault.conf" % (value, dropin),
        )
    else:
        sh("rm", "-f", "%s/bench-fault.conf" % dropin)
    sh("systemctl", "daemon-reload")
    sh("systemctl", "reset-failed", UNIT, check=False)


def http_ok(path, timeout=5):
    probe = "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:%d%s', timeout=%d)" % (
        PORT,
        path,
        timeout,
    )
    return sh("python3", "-c", probe, check=False).returncode == 0


def naive_gate(start, verdict):
    """Poll /v1/models every 2 s; healthy on the first 200, or give up after 600 s."""
    while time.monotonic() - start < NAIVE_WATCH:
        if http_ok("/v1/models"):
            verdict["result"], verdict["seconds"] = "healthy", time.monotonic() - start
            return
        time.sleep(2)
    verdict["result"], verdict["seconds"] = "still waiting", NAIVE_WATCH


def our_gate(since):
    args = json.dumps(
        {
            "name": "coder",
            "port": PORT,
            "model": "qwen3-coder",
            "since": since,
            "poll_interval": 1,
            "baseline_file": "/var/lib/sglang/coder/baseline.json",
            "record_baseline": False,
            "metrics_file": "/var/lib/sglang/coder/metrics.json",
        }
    )
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible")
    out = subprocess.run(
        [ansible, HOST, "-i", "inventories/lab/hosts.yml", "-m", "ddtree.sglang.sglang_health", "-a", args, "-o"],
        capture_output=True,
        text=True,
        check=False,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    text = out.stdout.split("=>", 1)[-1].strip()
    try:
        return json.loads(text)
    except ValueError:
        return {"passed": False, "msg": text[-300:], "failed_stage": "?"}


def measure(name, fault):
    set_fault(fault)
    since = sh("date", "-u", "+%Y-%m-%d %H:%M:%S").stdout.strip()
    start = time.monotonic()
    sh("systemctl", "restart", UNIT)
    naive = {}
    poller = threading.Thread(target=naive_gate, args=(start, naive))
    poller.start()
    result = our_gate(since)
    detected = time.monotonic() - start
    poller.join()  # the naive gate watches the same faulty start
    # Go back (as a rollback does), and time until the service generates again.
    set_fault(None)
    back = time.monotonic()
    sh("systemctl", "restart", UNIT)
    while not http_ok("/health", timeout=30):
        time.sleep(0.5)
    serving = time.monotonic() - back
    return {
        "fault": name,
        "detected": detected,
        "stage": "PASSED (missed)" if result.get("passed") else result.get("failed_stage"),
        "serving_again": serving,
        "naive": naive.get("result", "?"),
        "naive_seconds": naive.get("seconds", 0.0),
    }


def main(selected):
    rows = [measure(name, FAULTS[name]) for name in (selected or FAULTS)]
    print(
        "%-22s %-16s %10s %12s  %-32s %s"
        % ("fault", "gate stage", "detect s", "serving s", "naive /v1/models gate", "ratio")
    )
    for row in rows:
        if row["naive"] == "healthy":
            naive = "false pass at %.1f s (never detects)" % row["naive_seconds"]
            ratio = "inf (naive misses it)"
        else:
            naive = "no verdict in %.0f s (waits to %.0f s)" % (NAIVE_WATCH, NAIVE_LIMIT)
            ratio = "%.0fx faster" % (NAIVE_LIMIT / row["detected"])
        print(
            "%-22s %-16s %10.1f %12.1f  %-32s %s"
            % (row["fault"], row["stage"], row["detected"], row["serving_again"], naive, ratio)
        )


if __name__ == "__main__":
    main(sys.argv[1:])
