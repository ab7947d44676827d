# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The health gate's sequence: six stages, each failing fast with its evidence (docs/health-gate.md).

HealthGate runs unit_watch, health, chat, degenerate, baseline and performance in order, on the rules
of health_journal, health_unit, health_output and health_records. Its view of the host is a
ServiceIO (systemctl, journalctl, the port, HTTP) and its time a clock and a sleep, both passed in,
so the sequence is tested with a scripted host and no waiting. ddtree.sglang.sglang_health is the
module around it.
"""

from __future__ import annotations

import http.client
import json
import socket
import time

from ansible_collections.ddtree.sglang.plugins.module_utils.fleet_baselines import (
    FLEET,
    check_document,
    new_key_note,
    overall_reference,
    reference_for,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.health_journal import split_journal_output
from ansible_collections.ddtree.sglang.plugins.module_utils.health_output import (
    compare_metrics,
    compare_output,
    degenerate_output,
    redact,
    tokens_per_second,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.health_records import (
    baseline_add,
    baseline_key,
    metrics_add,
    previous_metrics,
    read_json,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.health_unit import (
    UNIT_PROPERTIES,
    StartWatch,
    kernel_oom_lines,
    parse_systemctl_show,
    wants_kernel_log,
)

STAGES = ("unit_watch", "health", "chat", "degenerate", "baseline", "performance")
TEXT_LIMIT = 500  # characters of a generated text or an HTTP body kept in results
# After a failed request, how long the gate waits for a unit whose journal shows a fatal error to go
# down: SGLang 0.5.23's watchdog sleeps 5 s ("Sleeping 5 seconds before crash diagnostics") before it
# kills its own process tree (docs/decisions/health-gate-death-wait.md). A unit still running after that
# is reported at the request's stage.
DEATH_WAIT_S = 15.0


class GateFailed(Exception):
    """A stage failed: kind (the result's failure_kind), reason, and evidence for the result.

    stage names the failed stage when it is not the one running: a server that died during a later
    stage fails at unit_watch.
    """

    def __init__(self, kind: str, reason: str, stage: str | None = None, **evidence):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.stage = stage
        self.evidence = evidence


def unit_name(service: str) -> str:
    return "sglang-%s.service" % service


def connect_host(host: str) -> str:
    """The address to reach a service listening on host: a wildcard address is reached through loopback."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


class ServiceIO:
    """The host as the gate sees it: the unit's state and journal, the kernel log, the port and HTTP.

    run_command is AnsibleModule.run_command; systemctl and journalctl are the binaries' paths.
    """

    def __init__(
        self,
        run_command,
        systemctl: str,
        journalctl: str,
        unit: str,
        host: str,
        port: int,
        api_key: str | None = None,
        connect_timeout: float = 1.0,
    ):
        self.run_command = run_command
        self.systemctl = systemctl
        self.journalctl = journalctl
        self.unit = unit
        self.host = connect_host(host)
        self.port = port
        self.api_key = api_key
        self.connect_timeout = connect_timeout
        self.cursor = None

    def unit_properties(self) -> dict:
        command = [self.systemctl, "show", self.unit, "-p", ",".join(UNIT_PROPERTIES)]
        rc, out, err = self.run_command(command)
        if rc != 0:
            raise GateFailed("systemctl", "%s exited with %d: %s" % (" ".join(command), rc, (err or out).strip()[:500]))
        return parse_systemctl_show(out)

    def journal_lines(self, since: str) -> list:
        """The unit's journal lines since `since` on the first call, then those after the last call's."""
        command = [self.journalctl, "-u", self.unit, "--no-pager", "-q", "-o", "cat", "--show-cursor"]
        command += ["--after-cursor", self.cursor] if self.cursor else ["--since", since]
        rc, out, err = self.run_command(command)
        if rc != 0 and err.strip():
            raise GateFailed("journal", "%s exited with %d: %s" % (" ".join(command), rc, err.strip()[:500]))
        lines, cursor = split_journal_output(out)
        self.cursor = cursor or self.cursor
        return lines

    def kernel_lines(self, since: str) -> list:
        rc, out, _err = self.run_command(
            [self.journalctl, "-k", "--no-pager", "-q", "-o", "short-precise", "--since", since]
        )
        return out.splitlines() if rc == 0 else []

    def port_open(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=self.connect_timeout):
                return True
        except OSError:
            return False

    def request(
        self, method: str, path: str, body: dict | None = None, timeout: float = 10.0, auth: bool = False
    ) -> dict:
        """-> {"status": int or None, "data": parsed JSON or None, "text": str, "seconds", "error": str or None}."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body)
        if auth and self.api_key:
            headers["Authorization"] = "Bearer %s" % self.api_key
        start = time.monotonic()
        status, text, error = None, "", None
        # Plain HTTP to the service's own port: http.client, one connection per request. (open_url built an
        # SSL context and loaded the system's CA certificates for every request, plain HTTP included: about
        # 70 ms of CPU each, which showed in the gate's own latencies and speeds on a busy host.)
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            connection.request(method, path, body=data.encode("utf-8") if data is not None else None, headers=headers)
            response = connection.getresponse()
            status = response.status
            text = response.read().decode("utf-8", "replace")
        except (socket.timeout, OSError, ValueError) as exc:
            if isinstance(exc, socket.timeout) or "timed out" in str(exc):
                error = "timed out after %.1f s" % timeout
            else:
                error = "%s: %s" % (type(exc).__name__, exc)
        except Exception as exc:  # http.client's RemoteDisconnected, IncompleteRead, BadStatusLine, ...
            error = "%s: %s" % (type(exc).__name__, exc)
        finally:
            connection.close()
        seconds = round(time.monotonic() - start, 3)
        parsed = None
        if text:
            try:
                parsed = json.loads(text)
            except ValueError:
                parsed = None
        return {
            "status": status,
            "data": parsed,
            "text": redact(text[:TEXT_LIMIT], self.api_key),
            "seconds": seconds,
            "error": redact(error, self.api_key),
        }


def describe(answer: dict) -> str:
    """A failed request's answer (ServiceIO.request) in a few words: its error, or its status and body."""
    if answer["error"]:
        return answer["error"]
    return "HTTP %s: %s" % (answer["status"], answer["text"][:200])


def _now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class _UnitWatch:
    """HealthGate's unit_watch stage, and the look at the unit and its journal that every later stage takes when
    a request fails (check_unit). Each part of HealthGate reads and writes the gate's state (params, io,
    result, watch, ...), which HealthGate.__init__ sets: one gate, split by stage to be read a stage at a time."""

    def unit_props(self) -> dict:
        props = self.io.unit_properties()
        self.result["unit_state"]["properties"] = props
        return props

    def since_of(self, props: dict) -> str:
        if self.params["since"]:
            return self.params["since"]
        stamp = props.get("InactiveExitTimestamp", "")
        return stamp if stamp and stamp != "n/a" else "now"

    def watch_once(self, port_open: bool = False) -> dict:
        props = self.unit_props()
        lines = self.io.journal_lines(self.since)
        state = self.watch.feed(self.clock(), props, lines, port_open)
        self.result["unit_state"].update(
            {key: self.watch.unit.get(key) for key in ("phase", "kind", "reason", "state")}
        )
        return state

    def fail_from_watch(self, stage: str | None = None, prefix: str = "", **evidence):
        """The watch failed: fetch the kernel log when it may tell an OOM, and raise with the evidence."""
        if wants_kernel_log(self.watch.unit):
            pids = [self.result["unit_state"]["properties"].get("ExecMainPID")]
            oom = kernel_oom_lines(self.io.kernel_lines(self.since), self.unit, pids)
            evidence["kernel_log"] = oom
            self.watch.refine(oom)
        failure = self.watch.failure
        raise GateFailed(failure["kind"], prefix + failure["reason"], stage=stage, **evidence)

    def check_unit(self, request: str, problem: str):
        """A request failed after the port answered: read the unit and its journal again.

        - The server died: the unit is no longer running (failed, exited, restarted by systemd), or its
          main process is not the one that became ready (someone restarted it). -> fail at unit_watch with
          the cause the journal and the unit give, naming the stage and the request it interrupted.
        - The unit still runs, but the journal shows a fatal error (SGLang kills its process tree seconds
          later) or the port no longer accepts connections (the process is exiting: a SIGKILLed launcher
          refuses connections while its unit still reads active): look again every
          poll_interval, up to DEATH_WAIT_S, for the unit to go down. Still running -> a fatal journal
          line fails this stage with its cause; otherwise the caller reports the request's failure.
        - Nothing wrong with the unit (nothing fatal, the port answers): return, and the caller reports
          the request's failure at its stage.
        """
        state = self.watch_once(port_open=True)
        deadline = self.clock() + DEATH_WAIT_S
        while self.watch.unit["alive"] and not self.pid_changed() and self.clock() < deadline:
            if state["state"] == "ready" and self.io.port_open():
                break
            self.sleep(self.params["poll_interval"])
            if state["state"] == "failed":
                state = self.watch.follow(self.unit_props(), self.io.journal_lines(self.since))
            else:
                state = self.watch_once(port_open=True)
        while state["state"] == "failing":  # the settle poll: the traceback's end and the unit's final state
            self.sleep(self.params["poll_interval"])
            state = self.watch_once(port_open=True)
        self.result["unit_state"].update(
            {key: self.watch.unit.get(key) for key in ("phase", "kind", "reason", "state")}
        )
        died = not self.watch.unit["alive"] or self.pid_changed()
        if not died:
            if state["state"] == "failed":
                self.fail_from_watch()
            return
        props = self.result["unit_state"]["properties"]
        died_during = {
            "stage": self.stage,
            "request": request,
            "error": problem,
            "main_pid_at_ready": self.ready_pid,
            "main_pid_now": props.get("MainPID"),
        }
        prefix = "the server died during the %s stage (%s failed: %s): " % (self.stage, request, problem)
        if state["state"] == "failed":
            self.fail_from_watch(stage="unit_watch", prefix=prefix, died_during=died_during)
        # Running, nothing fatal in the journal, but another main process: restarted behind the gate's back.
        raise GateFailed(
            "restarted",
            "%sthe unit's main process is PID %s, not PID %s that answered on the port: it "
            "was restarted (%s)" % (prefix, props.get("MainPID"), self.ready_pid, self.watch.unit["reason"]),
            stage="unit_watch",
            died_during=died_during,
        )

    def pid_changed(self) -> bool:
        """Whether the unit's main process is another than the one that became ready (0: none now)."""
        now = self.result["unit_state"]["properties"].get("MainPID")
        return bool(self.ready_pid) and self.ready_pid != "0" and now not in (None, "", "0") and now != self.ready_pid

    def stage_unit_watch(self):
        props = self.unit_props()
        self.since = self.since_of(props)
        started = int(props.get("ActiveEnterTimestampMonotonic") or 0) / 1e6
        measured_from = "gate start"
        if 0 < started <= self.t0:
            self.origin, measured_from = started, "unit start"
        self.watch = StartWatch(
            started_at=self.t0,
            no_progress_timeout=self.params["no_progress_timeout"],
            start_timeout=self.params["start_timeout"],
            settle_seconds=self.params["poll_interval"],
            extra_signatures=self.params["extra_signatures"],
            extra_progress_markers=self.params["extra_progress_markers"],
        )
        self.result["startup"] = {"since": self.since, "measured_from": measured_from}
        while True:
            state = self.watch_once(port_open=self.io.port_open())
            self.record_startup()
            if state["state"] == "failed":
                self.fail_from_watch()
            if state["state"] == "ready":
                self.ready_pid = self.result["unit_state"]["properties"].get("MainPID")
                return
            self.sleep(self.params["poll_interval"])

    def record_startup(self):
        def rel(moment):
            return None if moment is None else round(moment - self.origin, 3)

        self.result["startup"].update(
            {
                "time_to_first_progress_s": rel(self.watch.first_progress_at),
                "time_to_port_s": rel(self.watch.port_at),
                "progress": [{"marker": p["marker"], "at_s": rel(p["at"])} for p in self.watch.progress],
            }
        )


class _Serving:
    """HealthGate's health, chat and degenerate stages, the requests they make, and what the later stages key
    their records by (decoding_key, fleet_document). A part of HealthGate (see _UnitWatch)."""

    def stage_health(self):
        path = self.params["health_path"]
        deadline = self.clock() + self.params["health_timeout"]
        attempts = []
        self.result["health"] = {"path": path, "status": None, "latency_s": None, "attempts": attempts}
        while True:
            remaining = deadline - self.clock()
            answer = self.io.request("GET", path, timeout=max(1.0, remaining))
            attempts.append({"status": answer["status"], "seconds": answer["seconds"], "error": answer["error"]})
            del attempts[:-10]
            self.result["health"].update(status=answer["status"], latency_s=answer["seconds"])
            if answer["status"] == 200:
                return
            self.check_unit("GET %s" % path, describe(answer))
            if self.clock() >= deadline:
                break
            self.sleep(max(0.0, min(self.params["poll_interval"], deadline - self.clock())))
        models = self.io.request("GET", "/v1/models", timeout=5.0, auth=True)
        self.result["health"]["v1_models_status"] = models["status"]
        answered = [a for a in attempts if a["status"] is not None or (a["error"] or "").startswith("timed out")]
        kind = "hung" if len(answered) == len(attempts) else "unreachable"
        seen = ", ".join(str(a["status"]) if a["status"] is not None else a["error"] for a in attempts)
        reason = "%s did not answer 200 within %g s although the unit is %s (%s)" % (
            path,
            self.params["health_timeout"],
            self.result["unit_state"].get("state"),
            seen,
        )
        if kind == "hung":
            reason += "; the scheduler is hung"
        if models["status"] == 200:
            reason += "; /v1/models still answers 200 (answered from memory, it is not health)"
        raise GateFailed(kind, reason)

    def model_name(self) -> str:
        if self.model:
            return self.model
        answer = self.io.request("GET", "/v1/models", timeout=self.params["request_timeout"], auth=True)
        try:
            return answer["data"]["data"][0]["id"]
        except (TypeError, KeyError, IndexError):
            self.check_unit("GET /v1/models", describe(answer))
            raise GateFailed(
                "chat",
                "could not read the served model name from /v1/models (%s): %s"
                % (answer["status"] or answer["error"], answer["text"][:200]),
            ) from None

    def generate(self, prompt: str, max_tokens: int, what: str) -> dict:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        answer = self.io.request(
            "POST", "/v1/chat/completions", body, timeout=self.params["request_timeout"], auth=True
        )
        problem = None
        if answer["error"]:
            problem = answer["error"]
        elif answer["status"] != 200:
            problem = "HTTP %s: %s" % (answer["status"], answer["text"][:300])
        else:
            try:
                choice = answer["data"]["choices"][0]
                text = choice["message"]["content"] or ""
                tokens = (answer["data"].get("usage") or {}).get("completion_tokens")
                return {
                    "text": text,
                    "completion_tokens": tokens,
                    "finish_reason": choice.get("finish_reason"),
                    "seconds": answer["seconds"],
                }
            except (TypeError, KeyError, IndexError):
                problem = "an answer that is not a chat completion: %s" % answer["text"][:300]
        self.check_unit(what, problem)  # a crash explains a failed request better than the request does
        kind = "chat_timeout" if answer["error"] and answer["error"].startswith("timed out") else "chat"
        raise GateFailed(
            kind,
            "%s: /v1/chat/completions failed although %s answered 200: %s"
            % (what, self.params["health_path"], problem),
        )

    def stage_chat(self):
        self.model = self.model_name()
        reply = self.generate(self.params["chat_prompt"], self.params["chat_max_tokens"], "the chat request")
        self.chat_text = reply["text"]
        self.result["chat"] = {
            "text": reply["text"][:TEXT_LIMIT],
            "completion_tokens": reply["completion_tokens"],
            "finish_reason": reply["finish_reason"],
            "latency_s": reply["seconds"],
            "model": self.model,
        }

    def stage_degenerate(self):
        verdict = degenerate_output(self.chat_text)
        self.result["degenerate"] = verdict
        if verdict["degenerate"]:
            raise GateFailed("degenerate", "the chat output is degenerate: %s" % verdict["reason"])

    def server_info(self) -> dict:
        """/server_info, once per run, for the baseline key: -> the request's answer (ServiceIO.request)."""
        if self._server_info is None:
            self._server_info = self.io.request(
                "GET", "/server_info", timeout=self.params["request_timeout"], auth=True
            )
            if self._server_info["status"] != 200:
                self.check_unit("GET /server_info", describe(self._server_info))
        return self._server_info

    def decoding_key(self) -> dict:
        """What greedy outputs and metrics are comparable across (health_records.baseline_key), from
        /server_info; warns once when /server_info did not answer."""
        if self._key is None:
            info = self.server_info()
            self._key = baseline_key(self.model, info["data"] if info["status"] == 200 else None)
            if self._key["family"] == "?":
                self.warn(
                    "%s: /server_info did not answer (%s), so the baseline key %r does not name the decoding "
                    "family" % (self.unit, info["error"] or "HTTP %s" % info["status"], self._key["key"])
                )
        return self._key

    def fleet_document(self) -> dict | None:
        """The fleet's baselines (fleet_baselines), checked; None when none were given."""
        if self.params.get("fleet_baselines") is None:
            return None
        try:
            return check_document(self.params["fleet_baselines"], "fleet_baselines")
        except ValueError as exc:
            raise GateFailed("state_file", str(exc)) from None


class _Baseline:
    """HealthGate's baseline stage: greedy outputs against this host's baseline, else the fleet's. A part of
    HealthGate (see _UnitWatch)."""

    def stage_baseline(self):
        path, max_tokens = self.params["baseline_file"], self.params["max_tokens"]
        document = self.read_record(path) if path else None
        fleet = self.fleet_document() if path else None
        results = []
        key = self.decoding_key()
        # "incomplete" until every prompt was generated: a request that fails (the server died) leaves it so.
        self.result["baseline"] = {
            "status": "incomplete",
            "file": path,
            "model": self.model,
            "key": key["key"],
            "family": key["family"],
            "results": results,
        }
        new_document = document
        new_entries = None  # what this run records: the role adds it to the fleet's baselines
        mismatches = []
        for prompt in self.params["prompts"]:
            record = self.baseline_prompt(prompt, results, document, fleet, key, mismatches)
            if record is not None:
                # New here: recorded on this host (a fleet entry it matched becomes its own).
                new_document = baseline_add(new_document, key["key"], prompt, max_tokens, record)
                new_entries = baseline_add(new_entries, key["key"], prompt, max_tokens, record)
        self.result["baseline"]["status"] = "passed" if path else "skipped"
        if path:
            self.result["baseline"]["reference"] = overall_reference(
                [entry["reference"] for entry in results if "reference" in entry]
            )
        if mismatches:
            self.result["baseline"]["status"] = "failed"
            raise self.baseline_mismatch(mismatches, len(results), key["key"])
        if new_entries is not None:
            self.pending["baseline"] = new_document
            self.result["baseline"]["new_baselines"] = new_entries
        self.baseline_outcome([entry["status"] for entry in results], key["key"], fleet is not None)

    def baseline_prompt(self, prompt: str, results: list, document, fleet, key: dict, mismatches: list) -> dict | None:
        """Generate one baseline prompt and compare it with its reference: its entry goes into results, a
        mismatch into mismatches; -> what to record for it (None: nothing)."""
        max_tokens = self.params["max_tokens"]
        reply = self.generate(prompt, max_tokens, "baseline prompt %r" % prompt[:60])
        self.generations.append(reply)
        entry = {
            "prompt": prompt,
            "text": reply["text"][:TEXT_LIMIT],
            "completion_tokens": reply["completion_tokens"],
            "seconds": reply["seconds"],
        }
        results.append(entry)
        verdict = degenerate_output(reply["text"])
        if verdict["degenerate"]:
            entry["status"] = "degenerate"
            self.result["baseline"]["status"] = "failed"
            raise GateFailed(
                "degenerate",
                "the output for baseline prompt %r is degenerate: %s" % (prompt[:60], verdict["reason"]),
            )
        if not self.params["baseline_file"]:
            entry["status"] = "unchecked"
            return None
        # This host's baseline, else the fleet's (fleet_baselines.py): a blank host's first release is
        # compared too, and only a key with no reference anywhere is recorded unchecked.
        recorded, entry["reference"] = reference_for(document, fleet, key["key"], prompt, max_tokens)
        if recorded is not None:
            comparison = compare_output(recorded.get("text", ""), reply["text"], self.params["baseline_tolerance"])
            entry.update(comparison, status="match" if comparison["match"] else "mismatch")
            if entry["reference"] == FLEET:
                entry["reference_host"], entry["reference_release_id"] = (
                    recorded.get("host"),
                    recorded.get("release_id"),
                )
            if not comparison["match"]:
                mismatches.append((prompt, comparison, recorded, entry["reference"]))
                return None
            if entry["reference"] != FLEET:
                return None
        elif not self.params["record_baseline"]:
            entry["status"] = "missing"
            return None
        else:
            entry["status"] = "new"
        if not self.params["record_baseline"]:
            return None
        return {
            "text": reply["text"],
            "completion_tokens": reply["completion_tokens"],
            "recorded_at": _now_utc(),
            "release_id": self.params["release_id"],
        }

    def baseline_mismatch(self, mismatches: list, count: int, key: str) -> GateFailed:
        """The failure of greedy outputs that differ from their reference, told by the first of them."""
        prompt, comparison, recorded, reference = mismatches[0]
        whose = "this host's baseline"
        if reference == FLEET:
            whose = "the fleet's baseline (recorded on %s by release %s at %s; this host has none)" % (
                recorded.get("host") or "?",
                recorded.get("release_id") or "?",
                recorded.get("recorded_at") or "?",
            )
        return GateFailed(
            "baseline_mismatch",
            (
                "%d of %d greedy outputs differ from %s for %s (max_tokens %d); prompt %r differs "
                "after character %d (%d differ, %d allowed): expected %r, got %r"
            )
            % (
                len(mismatches),
                count,
                whose,
                key,
                self.params["max_tokens"],
                prompt[:60],
                comparison["common_prefix"],
                comparison["differing_chars"],
                comparison["allowed_chars"],
                comparison.get("expected_excerpt"),
                comparison.get("actual_excerpt"),
            ),
        )

    def baseline_outcome(self, statuses: list, key: str, with_fleet: bool):
        """A stage that passed: say whether it recorded new baselines, or had none to compare with."""
        if "new" in statuses:
            self.result["baseline"]["status"] = "recorded"
            self.result["baseline"]["note"] = new_key_note(
                key, self.params["max_tokens"], self.params["release_id"], with_fleet
            )
            self.warn("%s: %s" % (self.unit, self.result["baseline"]["note"]))
        elif "missing" in statuses:
            self.result["baseline"]["status"] = "missing"
            self.warn(
                "%s: no baseline in %s for %s (max_tokens %d) and record_baseline is false: outputs "
                "were not compared" % (self.unit, self.params["baseline_file"], key, self.params["max_tokens"])
            )


class _Performance:
    """HealthGate's performance stage: tokens/s and the acceptance length against floors and the previous
    release. A part of HealthGate (see _UnitWatch)."""

    def tokens_per_second_short(self, current: dict, floors: dict, previous) -> bool:
        """Whether tokens/s alone misses its floor or the previous release's number."""
        key = "tokens_per_second"
        return bool(
            compare_metrics(
                {key: current[key]}, {key: floors[key]}, {key: (previous or {}).get(key)}, self.params["max_regression"]
            )
        )

    def stage_performance(self):
        params = self.params
        current = {"tokens_per_second": tokens_per_second(self.generations), "accept_length": None}
        source, accept_detail = self.accept_length(current)
        previous = params["previous"]
        if previous is None and params["metrics_file"]:
            previous = previous_metrics(self.read_record(params["metrics_file"]), self.decoding_key()["key"])
        floors = {"tokens_per_second": params["min_tokens_per_second"], "accept_length": params["min_accept_length"]}
        rounds = self.confirmed_rounds(current, floors, previous)
        problems = compare_metrics(current, floors, previous, params["max_regression"])
        if current["accept_length"] is None and accept_detail.get("accept_length_error"):
            problems = [
                problem + " (POST /generate: %s)" % accept_detail["accept_length_error"]
                if problem.startswith("no acceptance length")
                else problem
                for problem in problems
            ]
        self.result["performance"] = dict(
            current,
            accept_length_source=source,
            **accept_detail,
            tokens_per_second_rounds=rounds,
            completion_tokens=sum(g["completion_tokens"] or 0 for g in self.generations),
            generation_s=round(sum(g["seconds"] for g in self.generations), 3),
            previous=previous,
            floors=floors,
            max_regression=params["max_regression"],
            problems=problems,
        )
        if problems:
            raise GateFailed("performance", "; ".join(problems))
        if params["record_metrics"]:
            self.pending["metrics"] = self.metrics_record(current, source)

    def accept_length(self, current: dict) -> tuple:
        """Fill current's accept_length (and server_info_error) -> (its source or None, the /generate detail)."""
        params = self.params
        # Read anew: the acceptance length must include the baseline stage's requests (the answer fetched for
        # the baseline key, before them, has none yet on a fresh server; docs/decisions/accept-length-source.md).
        info = self.io.request("GET", "/server_info", timeout=params["request_timeout"], auth=True)
        if info["status"] != 200:
            self.check_unit("GET /server_info", describe(info))
        if params.get("accept_length_from", "server_info") == "server_info":
            try:
                current["accept_length"] = info["data"]["internal_states"][0].get("avg_spec_accept_length")
            except (TypeError, KeyError, IndexError, AttributeError):
                current["server_info_error"] = info["error"] or "HTTP %s" % info["status"]
        # accept_length_from generate: the server's average depends on all it served since it started, so two
        # servers (a shadow and its production service) are compared on one request each, the same one.
        source = "server_info" if current["accept_length"] is not None else None
        accept_detail = {}
        if source is None and self.decoding_key()["family"] != "NONE" and params["prompts"]:
            accept_detail = self.accept_length_from_generate(params["prompts"][0], params["max_tokens"])
            current["accept_length"] = accept_detail.pop("accept_length")
            source = "generate meta_info" if current["accept_length"] is not None else None
        return source, accept_detail

    def confirmed_rounds(self, current: dict, floors: dict, previous) -> list:
        """tokens/s of each round: a shortfall is confirmed before it fails the release (current keeps the faster)."""
        params = self.params
        rounds = [current["tokens_per_second"]]
        if params["prompts"] and self.tokens_per_second_short(current, floors, previous):
            # A shortfall is confirmed before it fails the release: the prompts run once more and the faster
            # round counts. A slow release is slow twice; a host busy for a moment (a neighbour's job, a
            # first request's warm-up) is not, and a rollback for it would throw a good release away.
            again = [
                self.generate(p, params["max_tokens"], "performance re-measure %r" % p[:60]) for p in params["prompts"]
            ]
            rounds.append(tokens_per_second(again))
            current["tokens_per_second"] = max((r for r in rounds if r is not None), default=None)
        return rounds

    def metrics_record(self, current: dict, source) -> dict:
        """The metrics document with this run's numbers added (written once every stage passed)."""
        params = self.params
        return metrics_add(
            self.read_record(params["metrics_file"]),
            {
                "model": self.model,
                "key": self.decoding_key()["key"],
                "release_id": params["release_id"],
                "recorded_at": _now_utc(),
                "tokens_per_second": current["tokens_per_second"],
                "accept_length": current["accept_length"],
                "accept_length_source": source,
                "prompts": len(self.generations),
                "max_tokens": params["max_tokens"],
            },
        )

    def accept_length_from_generate(self, prompt: str, max_tokens: int) -> dict:
        """The acceptance length of one greedy generation, from SGLang's own per-request meta_info.

        For a speculative server whose /server_info has no average yet: SGLang 0.5.23 adds to
        avg_spec_accept_length only every decode_log_interval (40) decode batches, more than the gate's
        few generations on a fresh server. The native /generate answers each request's spec_accept_length
        (completion tokens / verify steps) in its meta_info; the OpenAI routes do not.
        -> {"accept_length": float or None, "accept_length_request": {...}} or, when it could not be
        read, {"accept_length": None, "accept_length_error": why}.
        """
        body = {"text": prompt, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0}}
        answer = self.io.request("POST", "/generate", body, timeout=self.params["request_timeout"], auth=True)
        meta = answer["data"].get("meta_info") if answer["status"] == 200 and isinstance(answer["data"], dict) else None
        if not isinstance(meta, dict):
            problem = (
                describe(answer)
                if answer["error"] or answer["status"] != 200
                else ("an answer without meta_info: %s" % answer["text"][:200])
            )
            self.check_unit("POST /generate", problem)  # a server that died explains it better
            return {"accept_length": None, "accept_length_error": problem}
        accept = meta.get("spec_accept_length")
        detail = {
            "accept_length": accept if isinstance(accept, (int, float)) and not isinstance(accept, bool) else None,
            "accept_length_request": {
                "prompt": prompt[:TEXT_LIMIT],
                "completion_tokens": meta.get("completion_tokens"),
                "spec_verify_ct": meta.get("spec_verify_ct"),
                "latency_s": answer["seconds"],
            },
        }
        if detail["accept_length"] is None:
            # SGLang sets it only when the request ran at least one verify step.
            detail["accept_length_error"] = "meta_info has no spec_accept_length (spec_verify_ct %s)" % meta.get(
                "spec_verify_ct"
            )
        return detail


class HealthGate(_UnitWatch, _Serving, _Baseline, _Performance):
    """One run of the gate over a service. params: the sglang_health module's options.

    run() -> (passed, message, result). Records (baseline, metrics) are written through write(path,
    document) only when every stage passed, and never in check mode; warn(text) takes warnings.
    """

    def __init__(
        self,
        params: dict,
        io: ServiceIO,
        check_mode: bool = False,
        warn=None,
        write=None,
        clock=time.monotonic,
        sleep=time.sleep,
    ):
        self.params = params
        self.io = io
        self.check_mode = check_mode
        self.warn = warn or (lambda text: None)
        self.write = write
        self.clock = clock
        self.sleep = sleep
        self.unit = unit_name(params["name"])
        self.since = None
        self.watch = None
        self.t0 = clock()
        self.origin = self.t0
        self.stage = STAGES[0]
        self.result = {
            "unit": self.unit,
            "service": params["name"],
            "release_id": params["release_id"],
            "stage": self.stage,
            "passed": False,
            "timings": {},
            "recorded": {"baseline": False, "metrics": False},
            "unit_state": {},
        }
        self.pending = {}  # what to record once every stage passed
        self.model = params["model"]
        self.chat_text = ""
        self.generations = []
        self._server_info = None  # /server_info's answer for the baseline key, fetched once
        self._key = None  # decoding_key()
        self.ready_pid = None  # the unit's MainPID when unit_watch saw the port answer

    def run(self) -> tuple:
        try:
            for stage in STAGES:
                self.stage = self.result["stage"] = stage
                start = self.clock()
                try:
                    getattr(self, "stage_" + stage)()
                finally:
                    self.result["timings"][stage] = round(self.clock() - start, 3)
        except GateFailed as failure:
            return self.failed(failure)
        for what, path in (("baseline", self.params["baseline_file"]), ("metrics", self.params["metrics_file"])):
            if what in self.pending:
                if not self.check_mode:
                    self.write(path, self.pending[what])
                self.result["recorded"][what] = True
        self.result["timings"]["total"] = round(self.clock() - self.t0, 3)
        self.result["passed"] = True
        performance = self.result.get("performance", {})
        message = "%s is healthy: port after %s s, /health %s s, %s tokens/s, acceptance length %s%s" % (
            self.unit,
            self.result["startup"].get("time_to_port_s"),
            self.result["health"]["latency_s"],
            performance.get("tokens_per_second"),
            performance.get("accept_length"),
            " (%s)" % performance["accept_length_source"] if performance.get("accept_length_source") else "",
        )
        return True, message, self.result

    def failed(self, failure: GateFailed) -> tuple:
        self.result["timings"]["total"] = round(self.clock() - self.t0, 3)
        if self.watch is not None:
            self.record_startup()
            self.result["journal_excerpt"] = self.watch.excerpt()
            self.result["signature_matches"] = self.watch.evidence()
        self.result.update(failure.evidence)
        stage = failure.stage or self.stage
        self.result.update(failed_stage=stage, failure_kind=failure.kind)
        message = "%s failed at %s (%s): %s" % (self.unit, stage, failure.kind, failure.reason)
        return False, redact(message, self.params["api_key"]), self.result

    def read_record(self, path: str | None) -> dict | None:
        try:
            return read_json(path)
        except (OSError, ValueError) as exc:
            raise GateFailed("state_file", "cannot read %s: %s" % (path, exc)) from None
