"""Rollout reports from recorded module results: statuses, before/after, gates, rollback evidence."""

import json

from ansible_collections.ddtree.sglang.plugins.plugin_utils.rollout_report import (
    build_report,
    gate_kind,
    gate_summary,
    render_markdown,
    summary_lines,
)

OLD, NEW = "0b7e3f2a9c1d5e6f", "9c1d0b7e3f2a4b5c"
JOURNAL = [
    "[2026-11-30 10:00:02] Load weight begin.",
    "Traceback (most recent call last):",
    "RuntimeError: lab runtime fault: crash_at_start ```",
    "sglang-coder.service: Failed with result 'exit-code'.",
]


def passed_gate(service, release, tps=41.5, accept=3.4):
    return {
        "service": service,
        "release_id": release,
        "passed": True,
        "stage": "performance",
        "startup": {"time_to_port_s": 3.2},
        "health": {"latency_s": 0.21},
        "chat": {"latency_s": 0.55},
        "baseline": {"status": "passed", "results": [{"status": "match"}, {"status": "match"}]},
        "performance": {
            "tokens_per_second": tps,
            "accept_length": accept,
            "previous": {"tokens_per_second": 40.0, "accept_length": 3.3, "release_id": OLD},
        },
        "timings": {"total": 9.8},
    }


def failed_gate(service, release):
    return {
        "service": service,
        "release_id": release,
        "passed": False,
        "stage": "unit_watch",
        "failed_stage": "unit_watch",
        "failure_kind": "crash",
        "msg": "sglang-coder.service failed at unit_watch (crash): the process exited",
        "journal_excerpt": JOURNAL,
        "signature_matches": [{"line": JOURNAL[2]}],
        "timings": {"total": 4.0},
    }


def link(host, service, before, current, state="current"):
    return {
        "host": host,
        "kind": "link",
        "service": service,
        "rollback": state == "previous",
        "result": {
            "service": service,
            "state": state,
            "changed": before != current,
            "release_id": current,
            "before": {"release_id": before, "previous_release_id": None},
        },
    }


def gate(host, result):
    return {"host": host, "kind": "gate", "service": result["service"], "result": result}


START = [
    {"host": "ct200", "kind": "start", "result": {"coder": {"release_id": OLD, "previous_release_id": None}}},
    {"host": "ct129", "kind": "start", "result": {"chat": {"release_id": OLD, "previous_release_id": None}}},
]
LOCK = {"host": "ct200", "kind": "lock", "result": {"waited_s": 0.1, "locked": ["ct129", "ct200"]}}


def canary_rolled_back():
    return (
        [LOCK]
        + START
        + [
            {"host": "ct200", "kind": "release", "result": {"release_id": NEW, "changed": True}},
            link("ct200", "coder", OLD, NEW),
            gate("ct200", failed_gate("coder", NEW)),
            link("ct200", "coder", NEW, OLD, state="previous"),
            gate("ct200", passed_gate("coder", OLD)),
            {
                "host": "ct200",
                "kind": "failed",
                "task": "Fail the host after a rollback",
                "result": {"msg": "ct200: the health gate failed for coder"},
            },
        ]
    )


def test_failed_canary_is_rolled_back_and_the_host_not_reached_keeps_its_release():
    report = build_report(canary_rolled_back(), ["ct200", "ct129"], meta={"revision": "b" * 40, "trigger": "test"})
    assert report["verdict"] == "failed" and report["kind"] == "rollout" and report["revision"] == "b" * 40
    canary, other = report["hosts"]
    assert canary["host"] == "ct200" and canary["status"] == "rolled back"
    coder = canary["services"][0]
    assert (coder["before_release_id"], coder["after_release_id"]) == (OLD, OLD)
    assert coder["gate"]["passed"] is False and coder["gate"]["failure_kind"] == "crash"
    assert coder["rollback"]["failed_release_id"] == NEW and coder["rollback"]["rolled_back_to_release_id"] == OLD
    assert coder["rollback"]["gate"]["passed"] is True
    assert coder["rollback"]["evidence"]["journal_excerpt"] == JOURNAL
    assert other["status"] == "not reached" and other["services"][0]["after_release_id"] == OLD
    json.dumps(report)  # JSON-ready


def test_markdown_of_a_failed_rollout_shows_before_after_evidence_and_gates():
    text = render_markdown(build_report(canary_rolled_back(), ["ct200", "ct129"], meta={"revision": "b" * 40}))
    assert text.startswith("## ddtree.sglang rollout: FAILED (1 not reached, 1 rolled back)")
    assert "| ct200 | coder | `0b7e3f2a9c1d` | `0b7e3f2a9c1d` | rolled back | failed at unit_watch (crash) |" in text
    assert "| ct129 | chat | `0b7e3f2a9c1d` | `0b7e3f2a9c1d` | not reached | – |" in text
    assert "### ct200 · coder: rolled back" in text
    assert "Release `9c1d0b7e3f2a` failed the health gate at **unit_watch** (crash)" in text
    assert "Rolled back to `0b7e3f2a9c1d`; its gate passed." in text
    assert "**What to do:** coder serves 0b7e3f2a9c1d as before. Fix the cause in 9c1d0b7e3f2a's source" in text
    # The journal's own ``` does not end the code block early.
    assert "````text\n" + "\n".join(JOURNAL) + "\n````" in text
    assert "Not reached (the rollout stopped before them; they keep the release they had): ct129" in text
    assert text.endswith(
        "\n\n### Health gates\n\n"
        "| Host | Service | Gate | Release | Result | Time to port | /health | Chat | Baseline | Tokens/s (prev) | "
        "Accept length (prev) | Total |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        "| ct200 | coder | deploy | 9c1d0b7e3f2a | failed at unit_watch | – | – | – | – | – | – | 4.0 s |\n"
        "| ct200 | coder | after rollback | 0b7e3f2a9c1d | passed | 3.2 s | 0.21 s | 0.55 s | passed (2/2) | "
        "41.5 (40.0) | 3.40 (3.30) | 9.8 s |\n"
    )
    assert "revision `bbbbbbbbbbbb`" in text


def test_successful_rollout_reports_updates_and_measurements():
    events = (
        [LOCK]
        + START
        + [
            {"host": "ct200", "kind": "release", "result": {"release_id": NEW, "changed": True}},
            link("ct200", "coder", OLD, NEW),
            gate("ct200", passed_gate("coder", NEW)),
            {"host": "ct129", "kind": "release", "result": {"release_id": NEW, "changed": True}},
            link("ct129", "chat", OLD, NEW),
            gate("ct129", passed_gate("chat", NEW)),
        ]
    )
    report = build_report(events, ["ct200", "ct129"])
    assert report["verdict"] == "succeeded" and [row["status"] for row in report["hosts"]] == ["updated", "updated"]
    assert report["hosts"][1]["services"][0]["gate"]["tokens_per_second"] == 41.5
    lines = summary_lines(report)
    assert lines[0] == ("ct200 coder: updated, release 0b7e3f2a9c1d -> 9c1d0b7e3f2a, gate passed", False)


def test_second_run_with_nothing_to_do_is_unchanged():
    events = START + [
        {"host": "ct200", "kind": "release", "result": {"release_id": OLD, "changed": False}},
        link("ct200", "coder", OLD, OLD),
    ]
    report = build_report(events, ["ct200"])
    assert report["hosts"][0]["status"] == "unchanged" and report["verdict"] == "succeeded"


def test_a_host_refused_before_the_switch_keeps_its_release_and_the_failure_is_named():
    events = START[:1] + [
        {
            "host": "ct200",
            "kind": "failed",
            "task": "Check each service's flags",
            "result": {
                "msg": "One or more items failed",
                "results": [{"failed": True, "msg": "DDTREE is not DFlash-family"}, {"failed": False}],
            },
        }
    ]
    report = build_report(events, ["ct200"])
    row = report["hosts"][0]
    assert row["status"] == "failed" and row["failure"]["msg"] == "DDTREE is not DFlash-family"
    assert row["services"][0]["after_release_id"] == OLD
    assert "- **ct200** at *Check each service's flags*: DDTREE is not DFlash-family" in render_markdown(report)


def test_refused_by_the_lock():
    holder = {"pid": 4242, "controller": "runner-1", "trigger": "pull timer", "revision": "a" * 40, "hosts": ["ct200"]}
    events = [
        {
            "host": "ct200",
            "kind": "lock",
            "result": {
                "failed": True,
                "refused": True,
                "waited_s": 0.0,
                "holder": holder,
                "msg": "another rollout holds the lock for ct200",
            },
        },
        {
            "host": "ct200",
            "kind": "failed",
            "task": "Take the rollout lock",
            "result": {"msg": "another rollout holds the lock for ct200"},
        },
    ]
    report = build_report(events, ["ct200", "ct129"])
    assert report["verdict"] == "refused" and report["lock"]["holder"]["pid"] == 4242
    text = render_markdown(report)
    assert "REFUSED" in text and "Nothing was changed: another rollout holds the lock for ct200" in text


def test_plan_lists_changes_with_diffs_and_the_release_each_service_would_get():
    events = START[:1] + [
        {"host": "ct200", "kind": "release", "result": {"release_id": NEW, "changed": True}},
        link("ct200", "coder", OLD, NEW),
        {
            "host": "ct200",
            "kind": "change",
            "task": "Render the unit",
            "item": "coder",
            "diff": "--- before\n+++ after\n-ExecStart=old\n+ExecStart=new\n",
        },
    ]
    report = build_report(events, ["ct200"], kind="plan")
    assert report["verdict"] == "planned" and report["hosts"][0]["status"] == "would change"
    text = render_markdown(report)
    assert text.startswith("## ddtree.sglang plan: 1 would change\n")
    assert "| ct200 | coder | `0b7e3f2a9c1d` | `9c1d0b7e3f2a` | would change | – |" in text
    assert "- Render the unit (coder)" in text and "+ExecStart=new" in text


def test_gate_summary_of_a_failed_gate_keeps_its_evidence_short():
    long_journal = ["line %d" % n for n in range(100)]
    summary = gate_summary(dict(failed_gate("coder", NEW), journal_excerpt=long_journal))
    assert summary["passed"] is False and summary["journal_excerpt"] == long_journal[-25:]
    assert summary["signature_matches"] == [JOURNAL[2]]


def test_unreachable_host():
    report = build_report(
        [{"host": "ct129", "kind": "unreachable", "task": "Gather GPU facts", "result": {"msg": "ssh: timeout"}}],
        ["ct200", "ct129"],
    )
    assert report["verdict"] == "failed" and report["hosts"][1]["status"] == "unreachable"
    assert report["hosts"][0]["status"] == "not reached"


def test_a_long_plan_keeps_its_markdown_short_and_says_so():
    events = [
        {"host": "ct%03d" % n, "kind": "change", "task": "Record the lock", "item": None, "diff": "+x\n" * 1300}
        for n in range(20)
    ]
    report = build_report(events, ["ct%03d" % n for n in range(20)], kind="plan")
    text = render_markdown(report)
    assert len(text) < 50000 and "diff(s) left out to keep this short: plan.json has every one." in text
    assert all(len(row["changes"][0]["diff"]) == 3900 for row in report["hosts"])


def gate_status(host, service, action, reason, release, verdict=None):
    return {
        "host": host,
        "kind": "verdicts",
        "service": None,
        "result": {
            "services": {
                service: {
                    "action": action,
                    "reason": reason,
                    "release_id": release,
                    "previous_release_id": OLD,
                    "verdict": verdict,
                }
            }
        },
    }


def test_a_release_left_ungated_by_an_interrupted_rollout_is_never_reported_unchanged():
    # The incident: current already on NEW (the run that switched it died before the verdict); this run
    # changes no link, gates NEW, and it passes.
    start = [{"host": "ct200", "kind": "start", "result": {"coder": {"release_id": NEW, "previous_release_id": OLD}}}]
    events = start + [
        {"host": "ct200", "kind": "release", "result": {"release_id": NEW, "changed": False}},
        link("ct200", "coder", NEW, NEW),
        gate_status("ct200", "coder", "gate", "interrupted", NEW),
        gate("ct200", passed_gate("coder", NEW)),
    ]
    report = build_report(events, ["ct200"])
    row = report["hosts"][0]
    assert report["verdict"] == "succeeded" and row["status"] == "gated after an interrupted rollout"
    assert row["services"][0]["recovery"]["note"].startswith(
        "release %s was left current without a gate verdict" % NEW[:12]
    )
    lines = summary_lines(report)
    assert "unchanged" not in lines[0][0] and "gate passed" in lines[0][0] and "interrupted rollout" in lines[0][0]
    assert "After an interrupted rollout:" in render_markdown(report)
    # The same run with a verdict already recorded (action none): unchanged, as before.
    events[3] = gate_status("ct200", "coder", "none", "passed", NEW)
    assert build_report(events[:4], ["ct200"])["hosts"][0]["status"] == "unchanged"
    # A release from before verdicts existed: gated once, and said so.
    events[3] = gate_status("ct200", "coder", "gate", "no_verdicts_yet", NEW)
    assert build_report(events, ["ct200"])["hosts"][0]["status"] == "gated once (no gate verdict recorded before)"


def test_a_failed_verdict_left_by_an_interrupted_rollback_is_rolled_back_with_that_verdict_as_evidence():
    verdict = {
        "verdict": "failed",
        "recorded_at": "2026-11-30T10:01:00Z",
        "stage": "baseline",
        "failure_kind": "baseline_mismatch",
        "msg": "outputs differ",
    }
    start = [{"host": "ct200", "kind": "start", "result": {"coder": {"release_id": NEW, "previous_release_id": OLD}}}]
    events = start + [
        link("ct200", "coder", NEW, NEW),
        gate_status("ct200", "coder", "rollback", "failed_verdict", NEW, verdict),
        link("ct200", "coder", NEW, OLD, state="previous"),
        gate("ct200", passed_gate("coder", OLD)),
        {"host": "ct200", "kind": "failed", "task": "Fail the host after a rollback", "result": {"msg": "failed"}},
    ]
    report = build_report(events, ["ct200"])
    coder = report["hosts"][0]["services"][0]
    assert report["hosts"][0]["status"] == "rolled back" and coder["after_release_id"] == OLD
    assert coder["rollback"]["failed_release_id"] == NEW and coder["rollback"]["gate"]["passed"] is True
    assert (
        coder["rollback"]["evidence"]["stage"] == "baseline"
        and "2026-11-30T10:01:00Z" in coder["rollback"]["evidence"]["msg"]
    )
    markdown = render_markdown(report)
    assert (
        "failed the health gate at **baseline** (baseline_mismatch)" in markdown and "had failed its gate" in markdown
    )


def test_a_release_switched_in_this_run_has_no_verdict_by_nature_and_is_simply_updated():
    events = START[:1] + [
        link("ct200", "coder", OLD, NEW),
        gate_status("ct200", "coder", "restart", "interrupted", NEW),
        gate("ct200", passed_gate("coder", NEW)),
    ]
    row = build_report(events, ["ct200"])["hosts"][0]
    assert row["status"] == "updated" and row["services"][0]["recovery"] is None


# ---- the rollout policy's bake (docs/rollout-policy.md) ---------------------------------------------


def bake(host, service, **result):
    return {
        "host": host,
        "kind": "bake",
        "service": service,
        "result": dict({"service": service, "release_id": NEW}, **result),
    }


def two_batches_deployed():
    return (
        [LOCK]
        + START
        + [
            {"host": "ct200", "kind": "release", "result": {"release_id": NEW, "changed": True}},
            link("ct200", "coder", OLD, NEW),
            gate("ct200", passed_gate("coder", NEW)),
            {"host": "ct129", "kind": "release", "result": {"release_id": NEW, "changed": True}},
            link("ct129", "chat", OLD, NEW),
            gate("ct129", passed_gate("chat", NEW)),
        ]
    )


def test_a_failed_bake_recheck_of_an_earlier_host_is_rolled_back_and_stops_the_rollout():
    events = two_batches_deployed() + [
        bake(
            "ct200",
            "coder",
            passed=False,
            failed=True,
            failed_stage="unit_watch",
            stage="unit_watch",
            failure_kind="child_crashed",
            msg="sglang-coder.service failed at unit_watch (child_crashed): a scheduler died",
        ),
        bake("ct129", "chat", passed=True, stage="performance"),
        link("ct200", "coder", NEW, OLD, state="previous"),
        gate("ct200", passed_gate("coder", OLD)),
        # The run_once stop ran on ct129: the rollout's stop, not ct129's failure.
        {"host": "ct129", "kind": "stop", "result": {"msg": "The bake's re-check failed for ct200 coder"}},
    ]
    report = build_report(events, ["ct200", "ct129"])
    assert report["verdict"] == "failed" and report["stopped"].startswith("The bake's re-check failed")
    canary, second = report["hosts"]
    assert canary["status"] == "rolled back" and second["status"] == "updated" and second["failure"] is None
    coder = canary["services"][0]
    assert coder["gate"]["passed"] is True  # the deploy gate stays what it was
    assert coder["bake"]["verdict"] == "failed" and coder["rollback"]["evidence"]["during"] == "bake"
    assert coder["rollback"]["rolled_back_to_release_id"] == OLD and coder["after_release_id"] == OLD
    text = render_markdown(report)
    assert "rollout: FAILED" in text and "failed the bake's re-check at **unit_watch** (child_crashed)" in text
    assert "**Stopped:**" in text
    assert (
        "\n\n### Bake re-checks\n\n"
        "| Host | Service | Result | Stage | Why |\n"
        "|---|---|---|---|---|\n"
        "| ct200 | coder | failed | unit_watch | "
        "sglang-coder.service failed at unit_watch (child_crashed): a scheduler died |\n"
        "| ct129 | chat | passed | performance | – |\n"
        "\n### Health gates\n"
    ) in text


def test_an_inconclusive_bake_pauses_with_the_resume_command():
    events = two_batches_deployed() + [
        bake("ct200", "coder", passed=True, stage="performance"),
        bake("ct129", "chat", unreachable=True, msg="ssh: connect to host ct129: timed out"),
        {
            "host": "ct200",
            "kind": "pause",
            "result": {"msg": "PAUSED: the bake's re-check was inconclusive for ct129 chat"},
        },
    ]
    report = build_report(
        events, ["ct200", "ct129"], meta={"command": {"cwd": "/srv/fleet", "argv": "ansible-playbook site.yml"}}
    )
    assert report["verdict"] == "paused" and "stopped" not in report
    assert [row["status"] for row in report["hosts"]] == ["updated", "inconclusive"]
    assert report["hosts"][1]["services"][0]["rollback"] is None  # nothing learnt: nothing rolled back
    text = render_markdown(report)
    assert "rollout: PAUSED" in text and "cd /srv/fleet && ansible-playbook site.yml" in text
    assert ("resume: cd /srv/fleet && ansible-playbook site.yml", True) in summary_lines(report)


def test_reports_without_a_bake_are_unchanged():
    report = build_report(canary_rolled_back(), ["ct200", "ct129"])
    assert "paused" not in report and "stopped" not in report
    assert all("bake" not in service for row in report["hosts"] for service in row["services"])


def test_a_bake_that_never_reached_its_host_is_inconclusive_not_failed():
    events = two_batches_deployed() + [
        {
            "host": "ct129",
            "kind": "bake",
            "service": None,
            "result": {"unreachable": True, "msg": "ssh: Connection refused"},
        },
        {"host": "ct200", "kind": "pause", "result": {"msg": "PAUSED: ..."}},
    ]
    report = build_report(events, ["ct200", "ct129"])
    assert report["verdict"] == "paused"
    assert report["hosts"][1]["status"] == "inconclusive" and report["hosts"][1]["failure"] is None
    assert "| ct129 | – | inconclusive | – | unreachable: ssh: Connection refused |" in render_markdown(report)


BASE, PINNED = "4b2e6f1a0c3d7a8b", "aa11bb22cc33dd44"


def choice(host, **services):
    reasons = {
        "candidate": "follows the rollout's candidate",
        "pin": "pinned by release: %s (revision r)" % PINNED,
        "base": "NEXTN does not load the overlay: the base release (the stack alone)",
    }
    return {
        "host": host,
        "kind": "choice",
        "result": {
            "services": {
                name: {"release_id": release_id, "follows": follows, "reason": reasons[follows]}
                for name, (release_id, follows) in services.items()
            }
        },
    }


def test_an_overlay_change_leaves_a_nextn_host_unchanged_and_says_which_release_each_service_follows_and_why():
    start = [
        {"host": "ct129", "kind": "start", "result": {"chat": {"release_id": BASE, "previous_release_id": None}}},
        {
            "host": "ct200",
            "kind": "start",
            "result": {
                "coder": {"release_id": OLD, "previous_release_id": None},
                "pinned": {"release_id": PINNED, "previous_release_id": None},
            },
        },
    ]
    events = start + [
        {"host": "ct129", "kind": "release", "result": {"release_id": NEW, "changed": True, "overlay": True}},
        {"host": "ct129", "kind": "release", "result": {"release_id": BASE, "changed": False, "overlay": False}},
        choice("ct129", chat=(BASE, "base")),
        link("ct129", "chat", BASE, BASE),
        {"host": "ct200", "kind": "release", "result": {"release_id": NEW, "changed": True, "overlay": True}},
        choice("ct200", coder=(NEW, "candidate"), pinned=(PINNED, "pin")),
        link("ct200", "coder", OLD, NEW),
        link("ct200", "pinned", PINNED, PINNED),
        gate("ct200", passed_gate("coder", NEW)),
    ]
    report = build_report(events, ["ct200", "ct129"])
    ct200, ct129 = report["hosts"]
    assert (
        ct129["status"] == "unchanged"
        and ct129["release"]["release_id"] == NEW
        and ct129["base_release"]["release_id"] == BASE
    )
    assert ct129["services"][0]["release_choice"]["follows"] == "base"
    assert [service["release_choice"]["follows"] for service in ct200["services"]] == ["candidate", "pin"]
    text = render_markdown(report)
    assert "| ct129 | chat | `4b2e6f1a0c3d` | `4b2e6f1a0c3d` (base, no overlay) | unchanged | – |" in text
    assert "| ct200 | pinned | `aa11bb22cc33` | `aa11bb22cc33` (pinned) | updated | – |" in text
    assert (
        "ct129 chat: unchanged, release 4b2e6f1a0c3d -> 4b2e6f1a0c3d (NEXTN does not load the overlay: "
        "the base release (the stack alone))",
        False,
    ) in summary_lines(report)
    # a plan shows each service's own choice, not the host's candidate
    plan = render_markdown(build_report(events[:5], ["ct129"], kind="plan"))
    assert "| ct129 | chat | `4b2e6f1a0c3d` | `4b2e6f1a0c3d` (base, no overlay) |" in plan


def shadow(verdict, problems=(), shadow_passed=True):
    return {
        "host": "ct200",
        "kind": "shadow",
        "service": "coder",
        "result": {
            "service": "coder",
            "shadow_service": "coder-shadow",
            "verdict": verdict,
            "promote": verdict == "promoted",
            "problems": list(problems),
            "outputs_compared": 3,
            "max_slowdown": 0.1,
            "shadow": {"release_id": NEW, "passed": shadow_passed, "tokens_per_second": 95.0, "accept_length": 4.0},
            "production": {"release_id": OLD, "passed": True, "tokens_per_second": 100.0, "accept_length": 4.0},
        },
    }


def shadowed_start():
    return [
        {
            "host": "ct200",
            "kind": "start",
            "result": {
                "coder": {"release_id": OLD, "previous_release_id": None},
                "coder-shadow": {"release_id": OLD, "previous_release_id": None},
            },
        },
        {"host": "ct200", "kind": "release", "result": {"release_id": NEW, "changed": True, "overlay": True}},
        {
            "host": "ct200",
            "kind": "choice",
            "result": {
                "services": {
                    "coder": {
                        "release_id": OLD,
                        "follows": "shadow",
                        "reason": "stays on %s until its shadow ..." % OLD,
                    },
                    "coder-shadow": {
                        "release_id": NEW,
                        "follows": "candidate",
                        "reason": "follows the rollout's candidate",
                    },
                }
            },
        },
        link("ct200", "coder", OLD, OLD),
        link("ct200", "coder-shadow", OLD, NEW),
        gate("ct200", passed_gate("coder-shadow", NEW)),
    ]


def test_a_promoted_shadow_moves_its_production_service_and_the_report_says_so_with_the_numbers():
    events = shadowed_start() + [
        shadow("promoted"),
        link("ct200", "coder", OLD, NEW),
        gate("ct200", passed_gate("coder", NEW)),
    ]
    report = build_report(events, ["ct200"])
    coder = report["hosts"][0]["services"][0]
    assert report["hosts"][0]["status"] == "updated" and coder["after_release_id"] == NEW
    assert coder["release_choice"]["follows"] == "promoted" and coder["shadow"]["verdict"] == "promoted"
    text = render_markdown(report)
    assert "| ct200 | coder | `0b7e3f2a9c1d` | `9c1d0b7e3f2a` (promoted by its shadow) | updated |" in text
    assert (
        "\n\n### Shadows\n\n"
        "| Host | Service | Shadow | Candidate | Result | Shadow vs production | Outputs compared | Why |\n"
        "|---|---|---|---|---|---|---|---|\n"
        "| ct200 | coder | coder-shadow | 9c1d0b7e3f2a | promoted | tokens/s 95.0 vs 100.0, acceptance 4.00 vs 4.00 | 3 | – |\n"
        "\n### Health gates\n"
    ) in text
    assert any(
        line.startswith(
            "ct200 coder: updated, release 0b7e3f2a9c1d -> 9c1d0b7e3f2a (promoted: its shadow coder-shadow "
            "passed and was not worse)"
        )
        and "shadow coder-shadow: promoted (tokens/s 95.0 vs 100.0" in line
        for line, _bad in summary_lines(report)
    )


def test_a_held_candidate_leaves_production_on_its_release_and_the_shadows_rollback_carries_the_reason():
    why = "the greedy output for prompt 'Write fib(n).' differs from production's after character 5"
    events = shadowed_start() + [
        shadow("held", [why]),
        link("ct200", "coder-shadow", NEW, OLD, state="previous"),
        gate("ct200", passed_gate("coder-shadow", OLD)),
        {
            "host": "ct200",
            "kind": "failed",
            "task": "Fail the host after a rollback",
            "result": {"msg": "ct200: the health gate failed for coder-shadow"},
        },
    ]
    report = build_report(events, ["ct200"])
    coder, rolled = report["hosts"][0]["services"]
    assert report["hosts"][0]["status"] == "rolled back"
    assert (coder["before_release_id"], coder["after_release_id"], coder["rollback"]) == (OLD, OLD, None)
    assert coder["release_choice"]["follows"] == "held" and coder["release_choice"]["reason"] == (
        "held on its release: its shadow coder-shadow was worse"
    )
    assert (
        rolled["rollback"]["evidence"]["stage"] == "shadow" and rolled["rollback"]["rolled_back_to_release_id"] == OLD
    )
    text = render_markdown(report)
    assert "| ct200 | coder | `0b7e3f2a9c1d` | `0b7e3f2a9c1d` (held by its shadow) | rolled back |" in text
    assert (
        "Release `9c1d0b7e3f2a` failed the comparison with its production service at **shadow** (shadow_worse): "
        "worse than coder: " + why
    ) in text
    assert "| ct200 | coder | coder-shadow | 9c1d0b7e3f2a | held |" in text
    # A shadow whose own gate failed carries that gate's evidence, not the comparison's.
    failed = shadowed_start()[:-1] + [
        gate("ct200", failed_gate("coder-shadow", NEW)),
        shadow("held", ["the shadow failed its gate"], False),
    ]
    rolled = build_report(failed, ["ct200"])["hosts"][0]["services"][1]
    assert rolled["rollback"]["evidence"]["stage"] == "unit_watch"


def test_a_production_service_measured_for_its_shadow_is_not_recorded_as_its_gate():
    # The rollout_summary callback asks gate_kind for every sglang_health result.
    assert gate_kind("measure") is None
    assert (gate_kind(None), gate_kind("bake"), gate_kind("stop")) == ("gate", "bake", "gate")


def tuning(needs_tuning, tuned=False, choice=None, key_changes=("release_id",)):
    return {
        "host": "ct200",
        "kind": "tuning",
        "service": "coder",
        "result": {
            "service": "coder",
            "needs_tuning": needs_tuning,
            "tuned": tuned,
            "changed": tuned,
            "choice": choice,
            "key_changes": list(key_changes),
        },
    }


DDTREE_CHOICE = {
    "algorithm": "DDTREE",
    "budget": 8,
    "top_k": 4,
    "status": "ddtree",
    "reason": "DDTREE budget 8 top_k 4 is the fastest ...",
    "gain_over_dflash": {"16": 0.051, "1": 0.123},
}
FALLBACK = {
    "algorithm": "DFLASH",
    "budget": None,
    "top_k": None,
    "status": "fallback",
    "gain_over_dflash": {"1": 0.0},
    "reason": "no DDTREE setting beats DFLASH by min_gain +3.0% at every declared concurrency: running DFLASH",
}


def rollout_with(*tunings):
    return build_report(
        START
        + [{"host": "ct200", "kind": "release", "result": {"release_id": NEW, "changed": True}}]
        + list(tunings)
        + [link("ct200", "coder", OLD, NEW), gate("ct200", passed_gate("coder", NEW))],
        ["ct200"],
    )


def test_a_tuning_is_reported_with_its_choice_and_gain_or_its_fallback_and_why():
    # The module's two calls: "needs tuning", then the decision, which replaces it.
    report = rollout_with(tuning(True), tuning(True, tuned=True, choice=DDTREE_CHOICE))
    line = summary_lines(report)[0][0]
    assert line.endswith(
        ", gate passed, tuned: DDTREE budget 8 top_k 4, +12.3% at concurrency 1, +5.1% at concurrency 16 over DFLASH"
    )
    text = render_markdown(report)
    assert (
        "\n\n### Tuning\n\n"
        "| Host | Service | Tuning | Runs | Gain over DFLASH | Why |\n"
        "|---|---|---|---|---|---|\n"
        "| ct200 | coder | tuned | DDTREE budget 8 top_k 4 | +12.3% at 1, +5.1% at 16 | release_id changed; "
        "DDTREE budget 8 top_k 4 is the fastest ... |\n"
        "\nNot reached"
    ) in text
    report = rollout_with(tuning(True), tuning(True, tuned=True, choice=FALLBACK))
    assert summary_lines(report)[0][0].endswith(
        ", fell back to DFLASH: no DDTREE setting beats DFLASH by min_gain +3.0% at every declared concurrency: running DFLASH"
    )
    single = dict(DDTREE_CHOICE, gain_over_dflash={"1": 0.2})
    assert summary_lines(rollout_with(tuning(True, tuned=True, choice=single)))[0][0].endswith(
        "tuned: DDTREE budget 8 top_k 4, +20.0% over DFLASH"
    )


def test_an_unchanged_tuning_says_so_and_a_plan_says_what_it_would_tune():
    report = rollout_with(tuning(False, choice=DDTREE_CHOICE, key_changes=()))
    assert summary_lines(report)[0][0].endswith(
        "tuning unchanged (DDTREE budget 8 top_k 4, +12.3% at concurrency 1, +5.1% at concurrency 16 over DFLASH)"
    )
    plan = build_report(START[:1] + [tuning(True, key_changes=("model", "release_id"))], ["ct200"], kind="plan")
    assert "would tune (model, release_id changed)" in summary_lines(plan)[0][0]
    assert "| ct200 | coder | would tune | – | – | model, release_id changed |" in render_markdown(plan)


def test_reports_without_a_tuning_have_no_tuning_section():
    assert "### Tuning" not in render_markdown(rollout_with())


def test_a_first_baseline_is_said_plainly_and_a_fleet_comparison_is_named():
    first = passed_gate("coder", NEW)
    note = (
        "no baseline for coder | DFLASH | tp 2 | sglang 0.5.23 (max_tokens 64) on this host or in the fleet's baselines: "
        "the greedy outputs of release %s are recorded as the first baseline of this key, not compared with anything"
        % NEW
    )
    first["baseline"] = {"status": "recorded", "reference": "none", "note": note, "results": [{"status": "new"}]}
    fleet = passed_gate("chat", NEW)
    fleet["baseline"] = {
        "status": "passed",
        "reference": "fleet",
        "results": [{"status": "match", "reference": "fleet"}],
    }
    events = (
        [LOCK]
        + START
        + [
            {"host": "ct200", "kind": "release", "result": {"release_id": NEW, "changed": True}},
            link("ct200", "coder", OLD, NEW),
            gate("ct200", first),
            {"host": "ct129", "kind": "release", "result": {"release_id": NEW, "changed": True}},
            link("ct129", "chat", OLD, NEW),
            gate("ct129", fleet),
        ]
    )
    report = build_report(events, ["ct200", "ct129"])
    lines = [text for text, _bad in summary_lines(report)]
    assert lines[1] == "ct200 coder: " + note
    assert lines[2].endswith("gate passed (outputs compared with the fleet's baseline: this host had none)")
    assert "Baselines:\n\n- ct200 · coder: %s." % note in render_markdown(report)


def test_a_rolled_back_service_says_why_what_was_done_and_what_to_do_right_after_its_line():
    lossy = dict(
        failed_gate("coder", NEW),
        stage="baseline",
        failed_stage="baseline",
        failure_kind="baseline_mismatch",
        msg="sglang-coder.service failed at baseline (baseline_mismatch): 3 of 3 greedy outputs differ from this "
        "host's baseline for coder | DFLASH | tp 2 | sglang 0.5.23 (max_tokens 64)",
    )
    events = canary_rolled_back()
    events[5] = gate("ct200", lossy)
    lines = summary_lines(build_report(events, ["ct200", "ct129"]))
    texts = [text for text, _bad in lines]
    first = texts.index(
        "ct200 coder: rolled back, release 0b7e3f2a9c1d -> 0b7e3f2a9c1d, gate failed at baseline "
        "(baseline_mismatch), rolled back to 0b7e3f2a9c1d"
    )
    why, done, todo = texts[first + 1 : first + 4]
    assert why == (
        "  why: release 9c1d0b7e3f2a failed the health gate at baseline (baseline_mismatch): 3 of 3 greedy outputs "
        "differ from this host's baseline for coder | DFLASH | tp 2 | sglang 0.5.23 (max_tokens 64)"
    )
    assert done == "  done: stopped 9c1d0b7e3f2a, pointed coder back at 0b7e3f2a9c1d and started it; its gate passed"
    assert todo.startswith(
        "  what to do: coder serves 0b7e3f2a9c1d as before. Fix the cause in 9c1d0b7e3f2a's source, then run "
        "the same command again (greedy outputs changed"
    )


def test_a_failed_gate_with_nothing_to_go_back_to_says_the_service_has_no_good_release():
    events = [
        LOCK,
        {"host": "ct200", "kind": "start", "result": {"coder": {"release_id": None, "previous_release_id": None}}},
        {"host": "ct200", "kind": "release", "result": {"release_id": NEW, "changed": True}},
        link("ct200", "coder", None, NEW),
        gate("ct200", failed_gate("coder", NEW)),
        {
            "host": "ct200",
            "kind": "failed",
            "task": "ddtree.sglang.sglang_service : Point current back at the previous release: coder",
            "result": {"msg": "service coder has no previous release to go back to"},
        },
    ]
    report = build_report(events, ["ct200"])
    assert report["hosts"][0]["status"] == "failed"  # nothing was rolled back
    texts = [text for text, _bad in summary_lines(report)]
    assert (
        "  done: stopped 9c1d0b7e3f2a; not rolled back - service coder has no previous release to go back to" in texts
    )
    assert any(text.startswith("  what to do: coder has no release that passed its gate here.") for text in texts)
