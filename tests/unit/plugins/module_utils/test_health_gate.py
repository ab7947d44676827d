"""The health gate's sequence on a scripted host and a fake clock: no systemd, no server, no waiting.

(tests/unit/plugins/modules/test_sglang_health.py drives the same sequence through the module, with
real processes and a real HTTP server.)
"""

import json
import pathlib

import pytest
from health_samples import FAILED_KILL, GOOD_START, SCHEDULER_CRASH, props

from ansible_collections.ddtree.sglang.plugins.module_utils.health_gate import HealthGate
from ansible_collections.ddtree.sglang.plugins.modules.sglang_health import ARGUMENT_SPEC

GOOD_TEXT = "The capital of France is Paris, and the Seine runs through it."
BASELINE = "/var/lib/sglang/coder/baseline.json"
KEY = "coder | DFLASH | tp 1 | sglang 0.5.23"  # what ScriptedHost's /server_info makes the baseline key
METRICS = "/var/lib/sglang/coder/metrics.json"
FIXTURES = pathlib.Path(__file__).resolve().parents[3] / "fixtures"
JOURNALS = FIXTURES / "sglang-journals"
# Real SGLang 0.5.23's answer to a native /generate on a DDTREE server (H200): meta_info with
# spec_accept_length 12.0 (24 completion tokens / 2 verify steps).
GENERATE_ANSWER = json.loads((FIXTURES / "sglang-conformance" / "generate.json").read_text())["body"]


def gate_params(**overrides):
    """The module's parameters as ansible-core fills them: its defaults, then overrides."""
    params = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    params.update(name="coder", model="coder", prompts=["List the first ten prime numbers, separated by commas."])
    params.update(overrides)
    return params


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class ScriptedHost:
    """A ServiceIO that answers from a script: the unit's properties, new journal lines, the port, HTTP."""

    def __init__(self, clock, journal=(), units=None):
        self.clock = clock
        self.journal = list(journal)  # lines not read yet
        self.units = list(units or [props()])  # consecutive answers of systemctl show; the last repeats
        self.port = True
        self.health = [200]  # consecutive /health statuses; the last repeats
        self.chat_text = GOOD_TEXT
        self.on_chat = None
        self.requests = []
        self.bodies = []  # (path, body, auth) of each POST
        self.server_info = {
            "speculative_algorithm": "DFLASH",
            "tp_size": 1,
            "version": "0.5.23",
            "internal_states": [{"avg_spec_accept_length": 3.4}],
        }
        self.generate_answer = GENERATE_ANSWER

    def unit_properties(self):
        return self.units.pop(0) if len(self.units) > 1 else self.units[0]

    def journal_lines(self, since):
        lines, self.journal = self.journal, []
        return lines

    def kernel_lines(self, since):
        return []

    def port_open(self):
        return self.port

    def request(self, method, path, body=None, timeout=10.0, auth=False):
        self.requests.append((method, path))
        if method == "POST":
            self.bodies.append((path, body, auth))
        self.clock.now += 0.5
        answer = {"status": 200, "data": None, "text": "", "seconds": 0.5, "error": None}
        if path == "/health":
            answer["status"] = self.health.pop(0) if len(self.health) > 1 else self.health[0]
        elif path == "/v1/chat/completions":
            if self.on_chat:
                return self.on_chat(answer)
            answer["data"] = {
                "choices": [{"message": {"content": self.chat_text}, "finish_reason": "length"}],
                "usage": {"completion_tokens": 32},
            }
        elif path == "/server_info":
            answer["data"] = self.server_info
        elif path == "/generate":
            answer["data"] = self.generate_answer
        return answer


@pytest.fixture
def clock():
    return Clock()


def run(host, clock, check_mode=False, **overrides):
    written, warnings = {}, []
    gate = HealthGate(
        gate_params(**overrides),
        host,
        check_mode=check_mode,
        warn=warnings.append,
        write=written.__setitem__,
        clock=clock,
        sleep=clock.sleep,
    )
    passed, message, result = gate.run()
    return passed, message, result, written, warnings


def test_a_good_start_passes_every_stage_and_records_baseline_and_metrics(clock):
    host = ScriptedHost(
        clock,
        journal=GOOD_START,
        units=[
            props(ActiveState="activating", SubState="start", ActiveEnterTimestampMonotonic="999000000"),
            props(ActiveEnterTimestampMonotonic="999000000"),
        ],
    )
    host.port = False
    clock_at_open = []

    def open_port_later(seconds):
        clock.now += seconds
        host.port = True
        clock_at_open.append(clock.now)

    clock.sleep = open_port_later
    passed, message, result, written, _warnings = run(
        host, clock, baseline_file=BASELINE, metrics_file=METRICS, record_metrics=True, release_id="r1"
    )
    assert passed, message
    # The unit started at 999 s (systemd's monotonic clock), the gate at 1000 s, the port opened at 1002 s.
    assert result["startup"]["measured_from"] == "unit start" and clock_at_open == [1002.0]
    assert message.startswith("sglang-coder.service is healthy: port after 3.0 s")
    assert list(result["timings"]) == ["unit_watch", "health", "chat", "degenerate", "baseline", "performance", "total"]
    assert result["baseline"]["status"] == "recorded" and result["recorded"] == {"baseline": True, "metrics": True}
    assert (
        written[BASELINE]["baselines"][KEY]["64"]["List the first ten prime numbers, separated by commas."][
            "release_id"
        ]
        == "r1"
    )
    assert written[METRICS]["records"][-1]["accept_length"] == 3.4
    # /server_info had the average: no extra generation for it.
    assert result["performance"]["accept_length_source"] == "server_info" and ("POST", "/generate") not in host.requests
    assert result["performance"]["tokens_per_second"] == 64.0  # 32 tokens in 0.5 s


def test_check_mode_writes_nothing_but_says_what_it_would_record(clock):
    passed, _message, result, written, _warnings = run(
        ScriptedHost(clock, journal=GOOD_START), clock, check_mode=True, baseline_file=BASELINE
    )
    assert passed and written == {} and result["recorded"]["baseline"] is True


def test_a_crash_during_the_chat_is_reported_as_the_crash(clock):
    host = ScriptedHost(clock, journal=GOOD_START)

    def crash(answer):
        host.journal += SCHEDULER_CRASH
        host.units = [FAILED_KILL]
        return dict(answer, status=None, error="RemoteDisconnected: Remote end closed connection without response")

    host.on_chat = crash
    passed, message, result, _written, _warnings = run(host, clock)
    # The unit is down: the server died, so the gate fails at unit_watch, naming the stage it interrupted.
    assert not passed and result["failed_stage"] == "unit_watch" and result["failure_kind"] == "scheduler_exception"
    assert result["stage"] == "chat" and result["died_during"]["stage"] == "chat"
    assert "the server died during the chat stage (the chat request failed: RemoteDisconnected" in message
    assert "the scheduler hit an exception: 'RuntimeError: DDTree" in message
    assert result["journal_excerpt"][-1].startswith("sglang-coder.service: Failed with result")


def test_a_hung_scheduler_fails_the_health_stage_after_its_timeout(clock):
    host = ScriptedHost(clock, journal=GOOD_START)
    host.health = [503]
    passed, message, result, _written, _warnings = run(host, clock, health_timeout=10)
    assert not passed and result["failure_kind"] == "hung"
    assert "/health did not answer 200 within 10 s" in message and "/v1/models still answers 200" in message
    assert 10 <= result["timings"]["health"] < 15


def test_a_missing_baseline_is_only_a_warning_when_not_recording(clock):
    passed, _message, result, written, warnings = run(
        ScriptedHost(clock, journal=GOOD_START), clock, baseline_file=BASELINE, record_baseline=False
    )
    assert passed and result["baseline"]["status"] == "missing" and written == {}
    assert "record_baseline is false" in warnings[0]


def test_an_unreadable_record_names_the_file(clock, tmp_path):
    broken = tmp_path / "metrics.json"
    broken.write_text("{")
    passed, message, result, _written, _warnings = run(
        ScriptedHost(clock, journal=GOOD_START), clock, metrics_file=str(broken)
    )
    assert not passed and result["failure_kind"] == "state_file" and str(broken) in message


# ---- the baseline policy (docs/health-gate.md, "The baseline policy") -------------------------------

PROMPT = "List the first ten prime numbers, separated by commas."


def recorded(key, text, accept_length=None, tokens_per_second=None):
    """A baseline document (and a metrics document) as an earlier release under `key` left them."""
    baseline = {"format": 2, "baselines": {key: {"64": {PROMPT: {"text": text, "release_id": "r0"}}}}}
    metrics = {
        "format": 2,
        "records": [
            {
                "model": "coder",
                "key": key,
                "release_id": "r0",
                "tokens_per_second": tokens_per_second,
                "accept_length": accept_length,
            }
        ],
    }
    return baseline, metrics


def run_with_records(clock, tmp_path, algorithm, chat_text, baseline, metrics=None, **overrides):
    import json

    host = ScriptedHost(clock, journal=GOOD_START)
    host.server_info = dict(host.server_info, speculative_algorithm=algorithm)
    host.chat_text = chat_text
    (tmp_path / "baseline.json").write_text(json.dumps(baseline))
    (tmp_path / "metrics.json").write_text(json.dumps(metrics or {"format": 2, "records": []}))
    return run(
        host,
        clock,
        baseline_file=str(tmp_path / "baseline.json"),
        metrics_file=str(tmp_path / "metrics.json"),
        **overrides,
    )


def test_ddtree_is_checked_against_the_baseline_dflash_recorded(clock, tmp_path):
    # DDTREE resolves as DFLASH and its greedy outputs equal DFLASH's (H200): DFLASH's baseline is its reference.
    baseline, _metrics = recorded(KEY, GOOD_TEXT)
    passed, message, result, written, _warnings = run_with_records(clock, tmp_path, "DDTREE", GOOD_TEXT, baseline)
    assert passed, message
    assert result["baseline"]["key"] == KEY and result["baseline"]["results"][0]["status"] == "match"
    assert BASELINE not in written


def test_a_lossy_walk_fails_against_the_baseline_of_its_family(clock, tmp_path):
    baseline, _metrics = recorded(KEY, GOOD_TEXT)
    lossy = "The capital of France is Paris, and the Loire runs through it."
    passed, message, result, _written, _warnings = run_with_records(clock, tmp_path, "DFLASH", lossy, baseline)
    assert not passed and result["failed_stage"] == "baseline" and result["failure_kind"] == "baseline_mismatch"
    assert KEY in message


def test_switching_from_none_to_a_speculative_algorithm_records_a_new_baseline_instead_of_rolling_back(clock, tmp_path):
    # NONE's greedy outputs legitimately differ from DFLASH's (bf16 verify forward vs one-token decode).
    none_key = "coder | NONE | tp 1 | sglang 0.5.23"
    baseline, metrics = recorded(none_key, "Something NONE said.", tokens_per_second=10000.0)
    passed, message, result, written, _warnings = run_with_records(
        clock, tmp_path, "DDTREE", GOOD_TEXT, baseline, metrics, record_metrics=True
    )
    assert passed, message
    assert result["baseline"]["status"] == "recorded" and result["performance"]["previous"] is None
    document = written[str(tmp_path / "baseline.json")]
    assert set(document["baselines"]) == {none_key, KEY}  # NONE's baseline is kept for a switch back


@pytest.mark.parametrize("changed", [{"tp_size": 2}, {"version": "0.5.24"}])
def test_a_new_tensor_parallel_size_or_sglang_version_records_anew(clock, tmp_path, changed):
    # TP=2 changed 2 of 64 greedy outputs of the same model on the H200 (near-ties): not a lossy release.
    baseline, _metrics = recorded(KEY, "An older text.")
    host_info_algorithm = "DFLASH"
    import json

    host = ScriptedHost(clock, journal=GOOD_START)
    host.server_info = dict(host.server_info, speculative_algorithm=host_info_algorithm, **changed)
    (tmp_path / "baseline.json").write_text(json.dumps(baseline))
    passed, message, result, _written, _warnings = run(host, clock, baseline_file=str(tmp_path / "baseline.json"))
    assert passed, message
    assert result["baseline"]["status"] == "recorded" and result["baseline"]["key"] != KEY


def test_metrics_are_compared_with_the_previous_release_of_the_same_key(clock, tmp_path):
    baseline, metrics = recorded(KEY, GOOD_TEXT, accept_length=8.0)
    passed, message, result, _written, _warnings = run_with_records(
        clock, tmp_path, "DFLASH", GOOD_TEXT, baseline, metrics
    )
    assert not passed and result["failed_stage"] == "performance" and "acceptance length 3.4" in message


def test_a_server_info_that_does_not_answer_keys_the_baseline_with_question_marks_and_warns(clock):
    host = ScriptedHost(clock, journal=GOOD_START)
    original = host.request

    def request(method, path, body=None, timeout=10.0, auth=False):
        answer = original(method, path, body, timeout, auth)
        return dict(answer, status=404, data=None) if path == "/server_info" else answer

    host.request = request
    passed, _message, result, _written, warnings = run(host, clock, baseline_file=BASELINE)
    assert passed and result["baseline"]["key"] == "coder | ? | tp ? | sglang ?"
    assert any("does not name the decoding family" in warning for warning in warnings)


def test_the_acceptance_length_is_read_after_the_baseline_requests(clock):
    host = ScriptedHost(clock, journal=GOOD_START)
    served = []
    original = host.request

    def request(method, path, body=None, timeout=10.0, auth=False):
        answer = original(method, path, body, timeout, auth)
        if path == "/server_info":  # a fresh server: no acceptance length until requests were served
            served_so_far = sum(1 for m, p in host.requests if p == "/v1/chat/completions")
            served.append(served_so_far)
            states = [{"avg_spec_accept_length": 5.0}] if served_so_far > 1 else [{}]
            return dict(answer, data=dict(host.server_info, internal_states=states))
        return answer

    host.request = request
    passed, message, result, _written, _warnings = run(host, clock, baseline_file=BASELINE)
    assert passed, message
    assert result["performance"]["accept_length"] == 5.0 and served[-1] == 2


# ---- the acceptance length on a fresh server (docs/health-gate.md, "6. performance") ----------------


def fresh(host):
    """A speculative server whose /server_info has no average yet (SGLang 0.5.23 adds to it only every 40
    decode batches: gate-run3, both calls)."""
    host.server_info = dict(host.server_info, internal_states=[{"last_gen_throughput": 120.0}])
    return host


def test_a_fresh_speculative_server_gives_its_acceptance_length_through_generate_meta_info(clock):
    host = fresh(ScriptedHost(clock, journal=GOOD_START))
    passed, message, result, written, _warnings = run(
        host, clock, api_key="k3y", min_accept_length=2.0, metrics_file=METRICS, record_metrics=True
    )
    assert passed, message
    performance = result["performance"]
    assert performance["accept_length"] == 12.0 and performance["accept_length_source"] == "generate meta_info"
    assert performance["accept_length_request"] == {
        "prompt": PROMPT,
        "completion_tokens": 24,
        "spec_verify_ct": 2,
        "latency_s": 0.5,
    }
    assert message.endswith("acceptance length 12.0 (generate meta_info)")
    # One greedy native generation of the first baseline prompt, with the API key, after the baseline's.
    assert [b for b in host.bodies if b[0] == "/generate"] == [
        ("/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 64, "temperature": 0}}, True)
    ]
    assert host.requests[-2:] == [("GET", "/server_info"), ("POST", "/generate")]
    assert performance["completion_tokens"] == 32  # tokens/s is still the baseline generations' alone
    assert written[METRICS]["records"][-1]["accept_length"] == 12.0
    assert written[METRICS]["records"][-1]["accept_length_source"] == "generate meta_info"


def test_accept_length_from_generate_asks_generate_though_the_server_has_an_average(clock):
    # A shadow and its production service: their averages cover whatever each served since it started,
    # so both are asked on the same request.
    host = ScriptedHost(clock, journal=GOOD_START)
    assert host.server_info["internal_states"][0]["avg_spec_accept_length"] == 3.4
    passed, message, result, _written, _warnings = run(host, clock, accept_length_from="generate")
    assert passed, message
    assert (
        result["performance"]["accept_length"] == 12.0
        and result["performance"]["accept_length_source"] == "generate meta_info"
    )
    assert host.requests[-1] == ("POST", "/generate")
    _passed, _message, result, _written, _warnings = run(ScriptedHost(clock, journal=GOOD_START), clock)
    assert (
        result["performance"]["accept_length"] == 3.4 and result["performance"]["accept_length_source"] == "server_info"
    )


def test_a_server_without_speculative_decoding_is_not_asked_for_an_acceptance_length(clock):
    host = fresh(ScriptedHost(clock, journal=GOOD_START))
    host.server_info = dict(host.server_info, speculative_algorithm=None)
    passed, message, result, _written, _warnings = run(host, clock, min_accept_length=2.0)
    assert ("POST", "/generate") not in host.requests
    assert result["performance"]["accept_length"] is None and result["performance"]["accept_length_source"] is None
    assert not passed and result["failed_stage"] == "performance"
    assert "no acceptance length was measured, but the floor is 2 (is speculative decoding on?)" in message


@pytest.mark.parametrize(
    "answer, why",
    [
        ({"status": 404, "data": {"detail": "Not Found"}, "text": '{"detail": "Not Found"}'}, "HTTP 404"),
        ({"data": {"text": "x", "meta_info": {"completion_tokens": 1}}}, "meta_info has no spec_accept_length"),
    ],
)
def test_an_acceptance_length_generate_cannot_give_is_none_and_says_why(clock, answer, why):
    host = fresh(ScriptedHost(clock, journal=GOOD_START))
    original = host.request
    host.request = lambda method, path, body=None, timeout=10.0, auth=False: (
        dict(original(method, path, body, timeout, auth), **answer)
        if path == "/generate"
        else original(method, path, body, timeout, auth)
    )
    passed, _message, result, _written, _warnings = run(host, clock)
    assert passed and result["performance"]["accept_length"] is None  # no floor: nothing to fail
    assert result["performance"]["accept_length_source"] is None and why in result["performance"]["accept_length_error"]
    passed, message, result, _written, _warnings = run(host, clock, min_accept_length=2.0)
    assert not passed and result["failed_stage"] == "performance" and "(POST /generate: %s" % why in message


def dies_at(host, died_path):
    """The server is killed from outside as the request to died_path arrives: refused, its unit failed."""
    original = host.request

    def request(method, path, body=None, timeout=10.0, auth=False):
        if path == died_path:
            host.units = [FAILED_KILL]
            return {
                "status": None,
                "data": None,
                "text": "",
                "seconds": 0.0,
                "error": "ConnectionRefusedError: refused",
            }
        return original(method, path, body, timeout, auth)

    host.request = request
    return host


def test_a_server_that_died_before_the_generate_request_fails_at_unit_watch(clock):
    host = dies_at(fresh(ScriptedHost(clock, journal=GOOD_START)), "/generate")
    passed, _message, result, _written, _warnings = run(host, clock, baseline_file=BASELINE)
    assert not passed and result["failed_stage"] == "unit_watch" and result["failure_kind"] == "killed"
    assert result["died_during"]["stage"] == "performance" and result["died_during"]["request"] == "POST /generate"


# ---- a server that dies after it became ready (docs/health-gate.md, "A server that dies during the gate")


def chat_failing_at(host, number, error, then=None):
    """Make the host's chat request `number` (1: the chat stage, 2: the first baseline prompt) fail with
    `error`; `then(host)` changes the host as the failure happens (the server dying)."""
    calls = []

    def on_chat(answer):
        calls.append(1)
        if len(calls) == number:
            if then:
                then(host)
            return dict(answer, status=None, error=error)
        return dict(
            answer,
            data={
                "choices": [{"message": {"content": GOOD_TEXT}, "finish_reason": "length"}],
                "usage": {"completion_tokens": 32},
            },
        )

    host.on_chat = on_chat


def test_a_scheduler_killed_during_the_baseline_fails_at_unit_watch_with_the_watchdogs_line(clock):
    # The real journal of a DFLASH server whose scheduler was SIGKILLed on the H200 (gate-run2): SGLang's
    # watchdog names the dead child, sleeps 5 s, then kills its own tree; the unit goes down only then.
    lines = (JOURNALS / "scheduler-killed-dflash.log").read_text().splitlines()
    crash_at = next(i for i, line in enumerate(lines) if "Triggering SIGQUIT" in line)
    torn_down_at = next(i for i, line in enumerate(lines) if "No live scheduler processes" in line)
    host = ScriptedHost(clock, journal=lines[:crash_at])
    looks = []

    def unit_properties():  # running for two more looks (the watchdog's 5 s sleep), then killed
        looks.append(clock.now)
        if len(looks) <= 2:
            return props()
        host.journal += lines[torn_down_at:]  # the tree's tear-down, as the unit goes down
        host.unit_properties = lambda: FAILED_KILL
        return FAILED_KILL

    def scheduler_killed(host):
        host.journal += lines[crash_at:torn_down_at]
        looks.clear()
        host.unit_properties = unit_properties

    chat_failing_at(host, 2, "RemoteDisconnected: Remote end closed connection without response", scheduler_killed)
    passed, message, result, _written, _warnings = run(host, clock, baseline_file=BASELINE)
    assert not passed and result["failed_stage"] == "unit_watch" and result["failure_kind"] == "child_crashed"
    assert message.startswith(
        "sglang-coder.service failed at unit_watch (child_crashed): the server died during the "
        "baseline stage (baseline prompt 'List the first ten prime numbers"
    )
    assert "Subprocess scheduler_0 (pid=2373) crashed with exit code -9" in message
    assert "status=9/KILL" in message  # the unit's own word, read once it went down
    assert result["died_during"] == {
        "stage": "baseline",
        "request": "baseline prompt 'List the first ten prime numbers, separated by commas.'",
        "error": "RemoteDisconnected: Remote end closed connection without response",
        "main_pid_at_ready": "4182",
        "main_pid_now": "0",
    }
    assert result["stage"] == "baseline" and "baseline" in result["timings"] and len(looks) == 3
    assert result["baseline"]["status"] == "incomplete" and result["baseline"]["results"] == []
    assert result["unit_state"]["state"] == "failed/failed" and "kill_process_tree" in result["journal_excerpt"][-1]


def test_a_launcher_killed_during_the_baseline_fails_at_unit_watch_as_killed_from_outside(clock):
    # As measured on the H200 (gate-run3): the SIGKILLed launcher refuses connections at once, but its unit
    # still reads active/running at the next look (the process is still exiting); a look later it is down.
    host = ScriptedHost(clock, journal=GOOD_START)

    def launcher_killed(host):
        host.port = False
        host.units = [props(), FAILED_KILL]

    chat_failing_at(host, 2, "ConnectionRefusedError: [Errno 111] Connection refused", launcher_killed)
    passed, message, result, _written, _warnings = run(host, clock, baseline_file=BASELINE)
    assert not passed and result["failed_stage"] == "unit_watch" and result["failure_kind"] == "killed"
    assert "the server died during the baseline stage" in message and "Connection refused" in message
    assert "status=9/KILL by something outside SGLang" in message


@pytest.mark.parametrize(
    "error", ["ConnectionResetError: [Errno 104] Connection reset by peer", "timed out after 60.0 s"]
)
def test_a_failed_request_with_a_healthy_unit_stays_at_its_stage(clock, error):
    host = ScriptedHost(clock, journal=GOOD_START)
    chat_failing_at(host, 2, error)
    passed, message, result, _written, _warnings = run(host, clock, baseline_file=BASELINE)
    assert not passed and result["failed_stage"] == "baseline" and "died_during" not in result
    assert result["failure_kind"] == ("chat_timeout" if error.startswith("timed out") else "chat")
    assert message.startswith("sglang-coder.service failed at baseline (") and error in message


def test_a_server_error_with_a_healthy_unit_stays_at_its_stage(clock):
    host = ScriptedHost(clock, journal=GOOD_START)
    host.on_chat = lambda answer: dict(
        answer, status=500, text='{"object": "error", "message": "Internal server error"}'
    )
    passed, message, result, _written, _warnings = run(host, clock)
    assert not passed and result["failed_stage"] == "chat" and result["failure_kind"] == "chat"
    assert "HTTP 500" in message and "died_during" not in result


def test_a_unit_restarted_behind_the_gates_back_fails_at_unit_watch(clock):
    # `systemctl restart` by someone else: the unit is active again, nothing fatal in the journal, but
    # its main process is not the one that became ready.
    host = ScriptedHost(clock, journal=GOOD_START)
    chat_failing_at(
        host,
        2,
        "RemoteDisconnected: Remote end closed connection without response",
        lambda host: setattr(host, "units", [props(MainPID="5120", ExecMainPID="5120")]),
    )
    passed, message, result, _written, _warnings = run(host, clock, baseline_file=BASELINE)
    assert not passed and result["failed_stage"] == "unit_watch" and result["failure_kind"] == "restarted"
    assert "the unit's main process is PID 5120, not PID 4182 that answered on the port" in message


def test_a_server_info_that_fails_because_the_server_died_fails_at_unit_watch(clock):
    # /server_info is the baseline stage's first request (the baseline key).
    host = dies_at(ScriptedHost(clock, journal=GOOD_START), "/server_info")
    passed, message, result, _written, _warnings = run(host, clock, baseline_file=BASELINE)
    assert (
        not passed and result["failed_stage"] == "unit_watch" and result["died_during"]["request"] == "GET /server_info"
    )


def test_a_fatal_journal_line_on_a_unit_that_keeps_running_is_reported_at_the_requests_stage(clock):
    host = ScriptedHost(clock, journal=GOOD_START)
    chat_failing_at(host, 2, "timed out after 60.0 s", lambda host: host.journal.extend(SCHEDULER_CRASH[2:-3]))
    passed, message, result, _written, _warnings = run(host, clock, baseline_file=BASELINE)
    assert not passed and result["failed_stage"] == "baseline" and result["failure_kind"] == "scheduler_exception"
    assert "RuntimeError: DDTree verify" in message and "died_during" not in result
    assert result["timings"]["baseline"] >= 15  # it waited DEATH_WAIT_S for the unit to go down


# ---- the fleet's baselines (docs/health-gate.md, "The fleet's baselines") ----------------------------


def fleet_with(text, key=KEY, host="ct201"):
    entry = {"text": text, "release_id": "r0", "host": host, "recorded_at": "2026-12-04T10:00:00Z"}
    return {"format": 2, "baselines": {key: {"64": {PROMPT: entry}}}}


def test_a_blank_hosts_lossy_first_release_fails_against_the_fleets_baseline(clock, tmp_path):
    lossy = "The capital of France is Paris, and the Loire runs through it."
    host = ScriptedHost(clock, journal=GOOD_START)
    host.chat_text = lossy
    passed, message, result, written, _warnings = run(
        host,
        clock,
        baseline_file=str(tmp_path / "baseline.json"),
        fleet_baselines=fleet_with(GOOD_TEXT),
        release_id="lossy",
    )
    assert not passed and result["failed_stage"] == "baseline" and result["failure_kind"] == "baseline_mismatch"
    assert (
        "differ from the fleet's baseline (recorded on ct201 by release r0 at 2026-12-04T10:00:00Z; this host has none)"
        in message
    )
    assert result["baseline"]["reference"] == "fleet" and result["baseline"]["results"][0]["reference_host"] == "ct201"
    assert written == {} and "new_baselines" not in result["baseline"]


def test_a_blank_hosts_lossless_first_release_passes_against_the_fleets_baseline_and_keeps_it(clock, tmp_path):
    baseline = str(tmp_path / "baseline.json")
    passed, message, result, written, warnings = run(
        ScriptedHost(clock, journal=GOOD_START),
        clock,
        baseline_file=baseline,
        fleet_baselines=fleet_with(GOOD_TEXT),
        release_id="good",
    )
    assert passed, message
    assert result["baseline"]["status"] == "passed" and result["baseline"]["reference"] == "fleet"
    assert result["baseline"]["results"][0]["status"] == "match" and "note" not in result["baseline"]
    # The host now has a baseline of its own (its own later releases compare with it).
    assert written[baseline]["baselines"][KEY]["64"][PROMPT]["release_id"] == "good" and result["recorded"]["baseline"]
    assert not [warning for warning in warnings if "first baseline" in warning]


def test_a_key_with_no_reference_anywhere_is_recorded_and_said_plainly(clock, tmp_path):
    passed, message, result, written, warnings = run(
        ScriptedHost(clock, journal=GOOD_START),
        clock,
        baseline_file=str(tmp_path / "baseline.json"),
        fleet_baselines=fleet_with(GOOD_TEXT, key="other | DFLASH | tp 8 | sglang 0.5.23"),
        release_id="first",
    )
    assert passed, message
    assert result["baseline"]["status"] == "recorded" and result["baseline"]["reference"] == "none"
    note = result["baseline"]["note"]
    assert note == (
        "no baseline for %s (max_tokens 64) on this host or in the fleet's baselines: the greedy outputs of "
        "release first are recorded as the first baseline of this key, not compared with anything" % KEY
    )
    assert any(note in warning for warning in warnings)
    assert result["baseline"]["new_baselines"]["baselines"][KEY]["64"][PROMPT]["text"] == GOOD_TEXT


def test_the_hosts_own_baseline_comes_before_the_fleets(clock, tmp_path):
    baseline, _metrics = recorded(KEY, GOOD_TEXT)
    passed, message, result, written, _warnings = run_with_records(
        clock, tmp_path, "DDTREE", GOOD_TEXT, baseline, fleet_baselines=fleet_with("What another GPU said.")
    )
    assert passed, message
    assert result["baseline"]["reference"] == "host" and written.get(str(tmp_path / "baseline.json")) is None


def test_a_broken_fleet_document_names_the_option(clock, tmp_path):
    passed, message, result, _written, _warnings = run(
        ScriptedHost(clock, journal=GOOD_START),
        clock,
        baseline_file=str(tmp_path / "baseline.json"),
        fleet_baselines={"format": 2, "baselines": {KEY: {"64": {PROMPT: "x"}}}},
    )
    assert not passed and result["failure_kind"] == "state_file"
    assert 'fleet_baselines: the entries of key %r (max_tokens 64) are not {prompt: {"text": ...}}' % KEY in message
