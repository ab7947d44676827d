"""monitoring: the file_sd targets and the gate's records made from the inventory and the hosts' verdicts."""

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils import monitoring

CODER = {"name": "coder", "port": 30000, "speculative": {"algorithm": "DDTREE", "budget": 15, "top_k": 8}}
CHAT = {"name": "chat", "port": 30001}
QUIET = {"name": "quiet", "port": 30002, "metrics": False, "speculative": {"algorithm": "DFLASH"}}
HOSTS = {"ct200": [CODER, QUIET], "ct129": [CHAT]}
PASSED = {"verdict": "passed", "measurements": {"tokens_per_second": 40.0, "accept_length": 3.2}}
STATUS = {
    "ct200": {"coder": {"release_id": "r1", "verdict": PASSED}, "quiet": {"release_id": "r9", "verdict": PASSED}},
    "ct129": {"chat": {"release_id": "r2", "verdict": {"verdict": "failed", "failure_kind": "degenerate"}}},
}


def test_targets_carry_host_service_algorithm_and_release_and_skip_opted_out_services():
    assert monitoring.target_groups(HOSTS, STATUS) == [
        {
            "targets": ["ct129:30001"],
            "labels": {"host": "ct129", "service": "chat", "algorithm": "NONE", "release_id": "r2"},
        },
        {
            "targets": ["ct200:30000"],
            "labels": {"host": "ct200", "service": "coder", "algorithm": "DDTREE", "release_id": "r1"},
        },
    ]


def test_targets_at_one_address_and_without_a_release_before_the_first_deploy():
    groups = monitoring.target_groups({"ct200": [CODER]}, {}, "127.0.0.1")
    assert groups == [
        {"targets": ["127.0.0.1:30000"], "labels": {"host": "ct200", "service": "coder", "algorithm": "DDTREE"}}
    ]


def test_a_service_across_hosts_is_scraped_on_its_head_only():
    kimi = {
        "name": "kimi",
        "port": 30010,
        "nodes": {"hosts": ["ct200", "ct129"]},
        "speculative": {"algorithm": "DDTREE"},
    }
    groups = monitoring.target_groups({"ct200": [kimi], "ct129": [kimi]}, {})
    assert [group["targets"] for group in groups] == [["ct200:30010"]]
    records = monitoring.gate_records({"ct200": [kimi], "ct129": [kimi]}, {}, 0.2, 1.5)
    assert {rule["labels"]["host"] for rule in records["groups"][0]["rules"]} == {"ct200"}


def rules_by_name(document):
    found = {}
    for rule in document["groups"][0]["rules"]:
        found.setdefault(rule["record"], []).append((rule["labels"], rule["expr"]))
    return found


def test_gate_records_floor_degenerate_and_acceptance():
    records = rules_by_name(monitoring.gate_records(HOSTS, STATUS, 0.25, 1.3))
    coder = {"host": "ct200", "service": "coder", "release_id": "r1"}
    chat = {"host": "ct129", "service": "chat", "release_id": "r2"}
    assert records[monitoring.GATE_TOKENS_PER_SECOND] == [(coder, "vector(40)")]
    assert records[monitoring.THROUGHPUT_FLOOR] == [(coder, "vector(30)")]
    # Only the speculative service has an acceptance floor (the opted-out one has nothing at all).
    assert records[monitoring.ACCEPT_LENGTH_FLOOR] == [({"host": "ct200", "service": "coder"}, "vector(1.3)")]
    assert sorted(records[monitoring.GATE_DEGENERATE], key=str) == sorted(
        [(chat, "vector(1)"), (coder, "vector(0)")], key=str
    )


def test_a_failed_gate_for_another_reason_is_not_degenerate_and_has_no_floor():
    status = {"ct129": {"chat": {"release_id": "r2", "verdict": {"verdict": "failed", "failure_kind": "baseline"}}}}
    records = rules_by_name(monitoring.gate_records({"ct129": [CHAT]}, status, 0.5, 1.3))
    assert records == {
        monitoring.GATE_DEGENERATE: [({"host": "ct129", "service": "chat", "release_id": "r2"}, "vector(0)")]
    }


@pytest.mark.parametrize(
    ("margin", "floor", "message"),
    [(1.0, 1.3, "throughput_margin must be in [0, 1), got 1.0"), (0.5, 0.9, "accept_length_floor must be at least 1")],
)
def test_bad_thresholds_are_refused_by_name(margin, floor, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        monitoring.gate_records(HOSTS, STATUS, margin, floor)


def test_status_by_host_keeps_what_ran():
    results = [
        {"item": "ct200", "services": {"coder": {"release_id": "r1"}}},
        {"item": "ct129", "skipped": True},
        {"item": "ct201", "failed": True, "msg": "cannot read the gate verdicts"},
        {"item": "ct202", "unreachable": True, "msg": "ssh: connect to host ct202 port 22: No route to host"},
    ]
    assert monitoring.status_by_host(results) == {"ct200": {"coder": {"release_id": "r1"}}}
