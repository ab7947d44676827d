"""The health gate's sequence on a scripted host and a fake clock: no systemd, no server, no waiting.

(tests/unit/plugins/modules/test_sglang_health.py drives the same sequence through the module, with
real processes and a real HTTP server.)
"""

import pytest
from health_samples import FAILED_KILL, GOOD_START, SCHEDULER_CRASH, props

from ansible_collections.ddtree.sglang.plugins.module_utils.health_gate import HealthGate
from ansible_collections.ddtree.sglang.plugins.modules.sglang_health import ARGUMENT_SPEC

GOOD_TEXT = "The capital of France is Paris, and the Seine runs through it."
BASELINE = "/var/lib/sglang/coder/baseline.json"
METRICS = "/var/lib/sglang/coder/metrics.json"


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
        self.clock.now += 0.5
        answer = {"status": 200, "data": None, "text": "", "seconds": 0.5, "error": None}
        if path == "/health":
            answer["status"] = self.health.pop(0) if len(self.health) > 1 else self.health[0]
        elif path == "/v1/chat/completions":
            if self.on_chat:
                return self.on_chat(answer)
            answer["data"] = {"choices": [{"message": {"content": self.chat_text}, "finish_reason": "length"}],
                              "usage": {"completion_tokens": 32}}
        elif path == "/server_info":
            answer["data"] = {"internal_states": [{"avg_spec_accept_length": 3.4}]}
        return answer


@pytest.fixture
def clock():
    return Clock()


def run(host, clock, check_mode=False, **overrides):
    written, warnings = {}, []
    gate = HealthGate(gate_params(**overrides), host, check_mode=check_mode, warn=warnings.append,
                      write=written.__setitem__, clock=clock, sleep=clock.sleep)
    passed, message, result = gate.run()
    return passed, message, result, written, warnings


def test_a_good_start_passes_every_stage_and_records_baseline_and_metrics(clock):
    host = ScriptedHost(clock, journal=GOOD_START, units=[
        props(ActiveState="activating", SubState="start", ActiveEnterTimestampMonotonic="999000000"),
        props(ActiveEnterTimestampMonotonic="999000000")])
    host.port = False
    clock_at_open = []

    def open_port_later(seconds):
        clock.now += seconds
        host.port = True
        clock_at_open.append(clock.now)

    clock.sleep = open_port_later
    passed, message, result, written, _warnings = run(host, clock, baseline_file=BASELINE, metrics_file=METRICS, record_metrics=True,
                                                      release_id="r1")
    assert passed, message
    # The unit started at 999 s (systemd's monotonic clock), the gate at 1000 s, the port opened at 1002 s.
    assert result["startup"]["measured_from"] == "unit start" and clock_at_open == [1002.0]
    assert message.startswith("sglang-coder.service is healthy: port after 3.0 s")
    assert list(result["timings"]) == ["unit_watch", "health", "chat", "degenerate", "baseline", "performance", "total"]
    assert result["baseline"]["status"] == "recorded" and result["recorded"] == {"baseline": True, "metrics": True}
    assert written[BASELINE]["baselines"]["coder"]["64"]["List the first ten prime numbers, separated by commas."]["release_id"] == "r1"
    assert written[METRICS]["records"][-1]["accept_length"] == 3.4
    assert result["performance"]["tokens_per_second"] == 64.0  # 32 tokens in 0.5 s


def test_check_mode_writes_nothing_but_says_what_it_would_record(clock):
    passed, _message, result, written, _warnings = run(ScriptedHost(clock, journal=GOOD_START), clock, check_mode=True,
                                                       baseline_file=BASELINE)
    assert passed and written == {} and result["recorded"]["baseline"] is True


def test_a_crash_during_the_chat_is_reported_as_the_crash(clock):
    host = ScriptedHost(clock, journal=GOOD_START)

    def crash(answer):
        host.journal += SCHEDULER_CRASH
        host.units = [FAILED_KILL]
        return dict(answer, status=None, error="RemoteDisconnected: Remote end closed connection without response")

    host.on_chat = crash
    passed, message, result, _written, _warnings = run(host, clock)
    assert not passed and result["failed_stage"] == "chat" and result["failure_kind"] == "scheduler_exception"
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
    passed, _message, result, written, warnings = run(ScriptedHost(clock, journal=GOOD_START), clock, baseline_file=BASELINE,
                                                      record_baseline=False)
    assert passed and result["baseline"]["status"] == "missing" and written == {}
    assert "record_baseline is false" in warnings[0]


def test_an_unreadable_record_names_the_file(clock, tmp_path):
    broken = tmp_path / "metrics.json"
    broken.write_text("{")
    passed, message, result, _written, _warnings = run(ScriptedHost(clock, journal=GOOD_START), clock, metrics_file=str(broken))
    assert not passed and result["failure_kind"] == "state_file" and str(broken) in message
