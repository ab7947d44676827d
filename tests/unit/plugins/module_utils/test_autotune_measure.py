"""The measuring client against a fake SGLang /generate over real HTTP, through the gate's own client."""

import json
import os
import threading
from http.server import ThreadingHTTPServer

import pytest
from conftest import run_module
from fake_http import JSONHandler, serving

from ansible_collections.ddtree.sglang.plugins.module_utils import autotune, autotune_measure
from ansible_collections.ddtree.sglang.plugins.module_utils.health_gate import ServiceIO
from ansible_collections.ddtree.sglang.plugins.modules import service_autotune_measure, service_autotune_trial

DDTREE_8_4 = {"algorithm": "DDTREE", "budget": 8, "top_k": 4}


class FakeGenerate(ThreadingHTTPServer):
    """/generate that answers max_new_tokens tokens in `verify_steps` verify steps, fails the requests
    whose number is in `fail`, and records the most requests it held at once. With `gather` set, it holds
    each request until the `gather` requests of its group (numbers 1-4, 5-8, ...) have all arrived, or
    GATHER_TIMEOUT passed: a client that does not keep them in flight together is slow and seen."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.verify_steps, self.fail, self.gather = 4, set(), 1
        self.health = [200]  # GET /health answers these statuses in turn, then the last one for ever
        self.arrived = threading.Condition()
        self.in_flight = self.most_in_flight = self.count = 0
        self.bodies, self.authorizations = [], []


GATHER_TIMEOUT = 2.0


class Handler(JSONHandler):
    def do_GET(self):
        health = self.server.health
        self.reply(health.pop(0) if len(health) > 1 else health[0], {})

    def do_POST(self):
        server = self.server
        body = self.json_body()
        with server.arrived:
            server.count += 1
            number = server.count
            server.in_flight += 1
            server.most_in_flight = max(server.most_in_flight, server.in_flight)
            server.bodies.append(body)
            server.authorizations.append(self.headers.get("Authorization"))
            server.arrived.notify_all()
            group_end = ((number - 1) // server.gather + 1) * server.gather
            server.arrived.wait_for(lambda: server.count >= group_end, timeout=GATHER_TIMEOUT)
            server.in_flight -= 1
        if number in server.fail:
            payload, status = {"object": "error", "message": "scheduler died"}, 500
        else:
            tokens = body["sampling_params"]["max_new_tokens"]
            meta = {"completion_tokens": tokens}
            if server.verify_steps:
                meta["spec_verify_ct"] = server.verify_steps
            payload, status = {"text": "x" * tokens, "meta_info": meta}, 200
        self.reply(status, payload)


@pytest.fixture
def server():
    with serving(FakeGenerate()) as fake:
        yield fake


def client(server, api_key="s3cret"):
    return ServiceIO(
        None, "systemctl", "journalctl", "sglang-coder.service", "127.0.0.1", server.server_address[1], api_key
    ).request


def test_a_level_keeps_its_concurrency_in_flight_and_counts_every_token(server):
    server.gather = 4
    level = autotune_measure.measure_load(client(server), ["a", "b", "c"], 4, 32, timeout=30)
    # max(3 prompts, 2 rounds x 4) = 8 requests, in two groups of four held together by the server.
    assert (level["requests"], server.count, server.most_in_flight) == (8, 8, 4)
    assert level["seconds"] < GATHER_TIMEOUT  # no group waited for a request that came late
    # tokens/s is from the unrounded wall time; "seconds" is rounded to the millisecond.
    assert level["completion_tokens"] == 8 * 32
    assert 256 / (level["seconds"] + 0.0005) <= level["tokens_per_second"] <= 256 / max(level["seconds"] - 0.0005, 1e-9)
    assert level["accept_length"] == 8.0 and level["error"] is None  # 32 tokens in 4 verify steps


def test_a_setting_is_measured_at_each_concurrency_lowest_first_after_a_warm_up(server):
    measurements = autotune_measure.measure_setting(client(server), DDTREE_8_4, [2, 1], ["a", "b", "c"], max_tokens=32)
    assert [(m["algorithm"], m["budget"], m["top_k"], m["concurrency"], m["requests"]) for m in measurements] == [
        ("DDTREE", 8, 4, 1, 3),
        ("DDTREE", 8, 4, 2, 4),
    ]
    assert server.count == 1 + 3 + 4  # the warm-up, unmeasured, then each level
    assert server.bodies[0] == {"text": "a", "sampling_params": {"max_new_tokens": 32, "temperature": 0}}
    assert set(server.authorizations) == {"Bearer s3cret"}  # through the gate's client, with the key


def test_a_failed_request_fails_its_level_and_its_setting_is_not_chosen(server):
    server.fail = {3}  # the second request of concurrency 1 (after the warm-up)
    measurements = autotune_measure.measure_setting(client(server), DDTREE_8_4, [1], ["a", "b"], max_tokens=8)
    assert measurements[0]["tokens_per_second"] is None
    assert (
        measurements[0]["error"]
        == '1 of 2 requests failed, the first: HTTP 500: {"object": "error", "message": "scheduler died"}'
    )
    tuning = {"budgets": [8], "top_k": [4], "concurrency": [1], "min_gain": 0.03}
    dflash = {"algorithm": "DFLASH", "budget": None, "top_k": None, "concurrency": 1, "tokens_per_second": 1.0}
    choice = autotune.choose(tuning, [dflash] + measurements)
    assert choice["algorithm"] == "DFLASH" and choice["settings"][0]["status"] == "failed"


def test_a_failed_warm_up_fails_every_level_without_sending_them(server):
    server.fail = {1}
    measurements = autotune_measure.measure_setting(client(server), DDTREE_8_4, [1, 16], ["a"], max_tokens=8)
    assert server.count == 1
    assert [m["error"].startswith("the warm-up request failed: HTTP 500") for m in measurements] == [True, True]


def test_no_acceptance_length_without_verify_steps(server):
    server.verify_steps = None  # NONE: no speculative decoding
    (measurement,) = autotune_measure.measure_setting(
        client(server), {"algorithm": "NONE", "budget": None, "top_k": None}, [1], ["a"], max_tokens=8, warmup=0
    )
    assert measurement["accept_length"] is None and measurement["tokens_per_second"] > 0


# ---- waiting for a fresh server, and the module ---------------------------------------------------------


class Clock:
    """A clock that moves only when the code under test sleeps."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_it_waits_until_health_answers_200_and_gives_up_on_a_unit_that_exited_or_a_timeout(server):
    clock = Clock()
    server.health = [503, 503, 200]
    assert (
        autotune_measure.wait_ready(client(server), lambda: "active", 60, poll=2, clock=clock, sleep=clock.sleep)
        is None
    )
    assert clock.now == 4  # two polls waited for
    server.health = [503]
    states = iter(["activating", "failed"])
    problem = autotune_measure.wait_ready(
        client(server), lambda: next(states), 60, poll=2, clock=clock, sleep=clock.sleep
    )
    assert problem.startswith("the server exited before it was ready (unit failed; last /health: HTTP 503")
    clock = Clock()
    problem = autotune_measure.wait_ready(
        client(server), lambda: "activating", 10, poll=2, clock=clock, sleep=clock.sleep
    )
    assert problem.startswith("the server was not ready within 10 s (last /health: HTTP 503") and clock.now == 10


def fake_systemctl(tmp_path, monkeypatch, state):
    """systemctl and journalctl on PATH: `systemctl is-active` prints state."""
    for name, body in (("systemctl", "echo " + state), ("journalctl", "true")):
        tool = tmp_path / name
        tool.write_text("#!/bin/sh\n" + body + "\n")
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))


def module_args(server, **extra):
    return dict(
        {
            "unit": "sglang-coder-autotune.service",
            "port": server.server_address[1],
            "api_key": "s3cret",
            "setting": DDTREE_8_4,
            "concurrency": [2, 1],
            "max_tokens": 16,
            "start_timeout": 30,
        },
        **extra,
    )


def test_the_module_measures_a_ready_server_at_each_concurrency(server, tmp_path, monkeypatch, capsys):
    fake_systemctl(tmp_path, monkeypatch, "active")
    code, result = run_module(service_autotune_measure, module_args(server), capsys)
    assert code == 0 and result["changed"] is False and result["ready_s"] is not None
    assert [(m["concurrency"], m["requests"], m["error"]) for m in result["measurements"]] == [
        (1, len(autotune_measure.PROMPTS), None),
        (2, len(autotune_measure.PROMPTS), None),
    ]
    assert all(m["tokens_per_second"] > 0 and m["accept_length"] == 4.0 for m in result["measurements"])
    assert result["workload"] == {"prompts": "autotune-v1", "max_tokens": 16, "warmup": 1, "rounds": 2}
    assert server.bodies[1]["text"] == autotune_measure.PROMPTS[0]
    assert "s3cret" not in json.dumps(result)


def test_a_server_that_exits_at_start_is_a_failed_setting_not_a_failed_task(server, tmp_path, monkeypatch, capsys):
    fake_systemctl(tmp_path, monkeypatch, "failed")
    server.health = [503]
    code, result = run_module(service_autotune_measure, module_args(server), capsys)
    assert code == 0 and result["ready_s"] is None and server.count == 0
    assert [(m["concurrency"], m["tokens_per_second"]) for m in result["measurements"]] == [(1, None), (2, None)]
    assert result["measurements"][0]["error"].startswith("the server exited before it was ready (unit failed")


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"max_tokens": 0}, "max_tokens is 0; it must be above 0"),
        ({"request_timeout": -1.0}, "request_timeout is -1.0; it must be above 0"),
        ({"warmup": -1}, "warmup must be >= 0 and concurrency a non-empty list of integers >= 1 (got -1, [2, 1])"),
        ({"concurrency": []}, "(got 1, [])"),
        ({"concurrency": [1, 0]}, "(got 1, [1, 0])"),
    ],
)
def test_the_module_refuses_a_workload_it_cannot_measure_naming_the_value(
    server, tmp_path, monkeypatch, capsys, extra, message
):
    fake_systemctl(tmp_path, monkeypatch, "active")
    code, result = run_module(service_autotune_measure, module_args(server, **extra), capsys)
    assert code == 1 and message in result["msg"] and server.count == 0


def fake_trial_host(tmp_path, monkeypatch, fail_restart=False):
    """A host for service_autotune_trial: its directories under tmp_path, and a systemctl that logs every call
    and, when the instance starts, what it starts with (unit, current link, key, modes)."""
    root = tmp_path / "host"
    for name in ("services", "config", "state", "systemd"):
        (root / name).mkdir(parents=True)
    log = root / "systemctl.log"
    seen = root / "seen"
    body = (
        'echo "$*" >> %(log)s\n'
        'case "$1" in\n'
        "  restart)\n"
        "    { cat %(root)s/systemd/$2; readlink %(root)s/services/coder-autotune/current;\n"
        "      cat %(root)s/config/coder-autotune.api-key; stat -c %%a %(root)s/config/coder-autotune.env\n"
        "      stat -c %%a %(root)s/state/coder-autotune; } > %(seen)s\n"
        "    exit %(rc)d ;;\n"
        "  is-active) echo active ;;\n"
        "esac\n"
    ) % {"log": log, "root": root, "seen": seen, "rc": 1 if fail_restart else 0}
    for name, text in (("systemctl", body), ("journalctl", "true\n")):
        tool = tmp_path / name
        tool.write_text("#!/bin/sh\n" + text)
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))
    return root, log, seen


def trial_args(server, root, **extra):
    import grp
    import pwd

    measure = module_args(server)
    args = dict(
        # An entry of service_autotune's trials, as the role passes it.
        trial={
            "label": "DDTREE budget 8 top_k 4",
            "instance": {
                "name": "coder-autotune",
                "unit": measure["unit"],
                "host": "127.0.0.1",
                "port": measure["port"],
            },
            "release_dir": "/opt/sglang/releases/r1",
            "setting": measure["setting"],
            "concurrency": measure["concurrency"],
            "start_timeout": measure["start_timeout"],
        },
        api_key=measure["api_key"],
        max_tokens=measure["max_tokens"],
        services_root=str(root / "services"),
        config_dir=str(root / "config"),
        state_root=str(root / "state"),
        systemd_dir=str(root / "systemd"),
        owner=pwd.getpwuid(os.getuid()).pw_name,
        group=grp.getgrgid(os.getgid()).gr_name,
        unit_file="[Service]\nExecStart=/bin/true\n",
        environment_file="TOKEN=t0ken\n",
    )
    return dict(args, **extra)


def test_a_trial_writes_the_instance_as_a_service_measures_it_and_removes_it(server, tmp_path, monkeypatch, capsys):
    root, log, seen = fake_trial_host(tmp_path, monkeypatch)
    code, result = run_module(service_autotune_trial, trial_args(server, root), capsys)
    assert code == 0 and result["changed"] is True and result["ready_s"] is not None
    assert [(m["concurrency"], m["error"]) for m in result["measurements"]] == [(1, None), (2, None)]
    # It started on the unit given, its current link naming the setting's release, with the key root's alone.
    assert seen.read_text().splitlines() == [
        "[Service]",
        "ExecStart=/bin/true",
        "/opt/sglang/releases/r1",
        "s3cret",
        "600",
        "750",
    ]
    calls = log.read_text().splitlines()
    assert calls[:2] == ["daemon-reload", "restart sglang-coder-autotune.service"]
    assert calls[-2:] == ["stop sglang-coder-autotune.service", "daemon-reload"]
    # Nothing of it is left, and neither the key nor the environment is in the result.
    assert sorted(path.name for path in root.rglob("*")) == sorted(
        ["services", "config", "state", "systemd", "systemctl.log", "seen"]
    )
    assert "s3cret" not in json.dumps(result) and "t0ken" not in json.dumps(result)


def test_a_trial_that_cannot_start_fails_after_the_instance_is_removed(server, tmp_path, monkeypatch, capsys):
    root, log, _seen = fake_trial_host(tmp_path, monkeypatch, fail_restart=True)
    code, result = run_module(service_autotune_trial, trial_args(server, root, api_key=None), capsys)
    assert code == 1 and result["msg"].startswith("coder-autotune: systemctl restart sglang-coder-autotune.service")
    assert log.read_text().splitlines()[-2:] == ["stop sglang-coder-autotune.service", "daemon-reload"]
    assert sorted(path.name for path in root.rglob("*")) == sorted(
        ["services", "config", "state", "systemd", "systemctl.log", "seen"]
    )
    assert server.count == 0


def test_a_trial_in_check_mode_writes_and_runs_nothing(server, tmp_path, monkeypatch, capsys):
    root, log, _seen = fake_trial_host(tmp_path, monkeypatch)
    code, result = run_module(service_autotune_trial, dict(trial_args(server, root), _ansible_check_mode=True), capsys)
    assert code == 0 and result["measurements"] == [] and not log.exists()
    assert result["files"]["unit"] == str(root / "systemd" / "sglang-coder-autotune.service")
