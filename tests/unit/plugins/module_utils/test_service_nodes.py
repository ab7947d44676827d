"""Services across hosts: the rules (each message names the host, the field and the fix), the flags and
environment of each rank, the start order and the verdict of the whole service."""

import copy

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils import service_nodes, services

KIMI = {
    "name": "kimi",
    "model_path": "/models/kimi",
    "draft_model_path": "/models/kimi-dflash",
    "gpus": [0, 1],
    "tp_size": 4,
    "host": "0.0.0.0",
    "port": 30000,
    "speculative": {"algorithm": "DDTREE", "budget": 15, "top_k": 8},
    "nodes": {"hosts": ["ct200", "ct129"], "dist_init_addr": "10.88.0.2", "dist_init_port": 20000, "interface": "eth0"},
}
IFACES = ("lo", "eth0")
HEAD_ADDRESSES = ["10.88.0.2"]
WORKER_ADDRESSES = ["10.88.0.3"]


def kimi(**changes):
    service = copy.deepcopy(KIMI)
    for key, value in changes.items():
        if key.startswith("nodes_"):
            service["nodes"][key[len("nodes_") :]] = value
        else:
            service[key] = value
    return service


def problems(service, host="ct200", others=(), interfaces=IFACES, addresses=None):
    if addresses is None:
        addresses = HEAD_ADDRESSES if host == "ct200" else WORKER_ADDRESSES
    return services.service_problems([service, *others], [0, 1], host, list(interfaces), addresses)


def test_a_good_declaration_has_no_problems_on_either_node():
    assert problems(KIMI, "ct200") == []
    assert problems(KIMI, "ct129") == []


@pytest.mark.parametrize(
    "service, host, expected",
    [
        (kimi(nodes_hosts=["ct200"]), "ct200", "nodes.hosts ['ct200'] names fewer than 2 hosts; list every host"),
        (kimi(nodes_hosts=["ct200", "ct200"]), "ct200", "names a host twice"),
        (kimi(), "ct999", "ct999: sglang_services[0] (kimi): nodes.hosts ['ct200', 'ct129'] does not name ct999"),
        (
            kimi(nodes_dist_init_addr=None),
            "ct200",
            "nodes.dist_init_addr is not set; set it to the address of the head ct200",
        ),
        (kimi(nodes_interface=None), "ct129", "ct129: sglang_services[0] (kimi): nodes.interface is not set"),
        (
            kimi(nodes_dist_init_port=30000),
            "ct200",
            "nodes.dist_init_port 30000 collides with the HTTP port of service kimi",
        ),
        (kimi(nodes_dist_init_port=80), "ct200", "nodes.dist_init_port 80 must be a port from 1024 to 65535"),
        (
            kimi(tp_size=2),
            "ct200",
            "tp_size 2 is not the service's GPUs on all nodes (2 GPU(s) on each of 2 nodes); set tp_size to 4",
        ),
        (
            kimi(extra_args=["--pp-size", "2"]),
            "ct200",
            "extra_args holds --pp-size (pipeline parallelism); a service across hosts runs tensor parallelism only",
        ),
        (kimi(extra_args=["--enable-dp-attention"]), "ct129", "extra_args holds --enable-dp-attention (DP attention)"),
        (
            kimi(extra_args=["--node-rank=1"]),
            "ct200",
            "extra_args holds --node-rank, which the collection sets from nodes",
        ),
        (
            kimi(nodes_interface="ib0"),
            "ct129",
            "ct129: sglang_services[0] (kimi): nodes.interface ib0 does not exist on ct129 (its interfaces: eth0, lo)",
        ),
        (
            kimi(nodes_dist_init_addr="10.88.0.9"),
            "ct200",
            "nodes.dist_init_addr 10.88.0.9 is not an address of the head ct200 (its addresses: 10.88.0.2)",
        ),
    ],
)
def test_each_bad_declaration_is_refused_naming_host_field_and_fix(service, host, expected):
    found = problems(service, host)
    assert any(expected in problem for problem in found), found


def test_the_head_address_is_checked_on_the_head_only():
    # ct129 does not own the head's address, and must not: it is the worker.
    assert problems(kimi(nodes_dist_init_addr="10.88.0.9"), "ct129") == []


def test_dist_init_port_of_another_service_on_the_host_collides():
    other = kimi(name="glm", port=30001, gpus=[1], tp_size=2, nodes_dist_init_port=20000)
    first = kimi(gpus=[0], tp_size=2)
    found = problems(first, "ct200", others=[other])
    assert any("is also the dist-init port of service glm" in problem for problem in found), found


def test_interfaces_and_addresses_unknown_are_not_checked():
    assert services.service_problems([kimi(nodes_interface="ib0")], [0, 1], "ct129") == []


def test_a_single_host_service_keeps_its_tp_rule():
    single = {k: v for k, v in KIMI.items() if k != "nodes"}
    found = services.service_problems([single], [0, 1], "ct200")
    assert any("tp_size 4 does not divide the 2 GPU(s)" in problem for problem in found), found


def test_each_rank_gets_its_flags_and_the_interface():
    head, worker = services.unit_entry(KIMI, "ct200"), services.unit_entry(KIMI, "ct129")
    tail = ["--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "10.88.0.2:20000"]
    assert head["flags"][head["flags"].index("--nnodes") :][:6] == tail
    assert worker["flags"][worker["flags"].index("--nnodes") :][:6] == tail[:3] + ["1"] + tail[4:]
    assert (head["node_rank"], worker["node_rank"]) == (0, 1)
    assert worker["node_hosts"] == ["ct200", "ct129"]
    assert worker["environment"]["NCCL_SOCKET_IFNAME"] == "eth0"
    assert worker["environment"]["GLOO_SOCKET_IFNAME"] == "eth0"
    assert worker["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_the_services_own_environment_wins_over_the_interface():
    entry = services.unit_entry(kimi(environment={"NCCL_SOCKET_IFNAME": "^lo,docker"}), "ct129")
    assert entry["environment"]["NCCL_SOCKET_IFNAME"] == "^lo,docker"


def test_an_ipv6_head_is_bracketed():
    assert service_nodes.node_flags(kimi(nodes_dist_init_addr="fd00::2"), "ct129")[-1] == "[fd00::2]:20000"


def test_a_single_host_service_gets_no_node_flags():
    single = {k: v for k, v in KIMI.items() if k != "nodes"}
    entry = services.unit_entry(single, "ct200")
    assert "--nnodes" not in entry["flags"] and "NCCL_SOCKET_IFNAME" not in entry["environment"]
    assert entry["node_rank"] == 0


def facts(service="kimi", stack="s1", release="r1"):
    """A node's facts; service "kimi" is KIMI's declaration."""
    return {"service": KIMI if service == "kimi" else service, "stack_id": stack, "release_id": release}


def test_a_consistent_group_has_no_problems():
    assert service_nodes.node_group_problems("kimi", KIMI["nodes"]["hosts"], {"ct200": facts(), "ct129": facts()}) == []


@pytest.mark.parametrize(
    "nodes_facts, batch, expected",
    [
        ({"ct200": facts()}, None, "ct129 not in this run (limited out or unreachable)"),
        (
            {"ct200": facts(), "ct129": facts(stack="s2")},
            None,
            "ct129 runs stack s2, ct200 runs s1; every node needs the same stack",
        ),
        ({"ct200": facts(), "ct129": facts(release="r2")}, None, "ct129 runs release r2, ct200 runs r1"),
        (
            {"ct200": facts(), "ct129": facts(service=kimi(port=30001))},
            None,
            "ct129 declares it differently from ct200 in port",
        ),
        ({"ct200": facts(), "ct129": facts(service=None)}, None, "ct129 declares no service kimi"),
        ({"ct200": facts(), "ct129": facts()}, ["ct200"], "ct129 not in the same rollout batch as the others"),
    ],
)
def test_group_problems_name_the_node_and_the_fix(nodes_facts, batch, expected):
    found = service_nodes.node_group_problems("kimi", KIMI["nodes"]["hosts"], nodes_facts, batch)
    assert any(expected in problem for problem in found), found


def test_a_node_of_another_batch_is_named_once_and_not_compared():
    found = service_nodes.node_group_problems(
        "kimi", KIMI["nodes"]["hosts"], {"ct200": facts(), "ct129": facts(stack=None, release=None)}, ["ct200"]
    )
    assert len(found) == 1 and "ct129 not in the same rollout batch" in found[0], found


def test_workers_start_before_the_head():
    entries = [{"name": "kimi", "node_rank": 0}, {"name": "chat"}, {"name": "kimi", "node_rank": 1}]
    workers, rest = service_nodes.split_start_order(entries)
    assert workers == [{"name": "kimi", "node_rank": 1}]
    assert rest == [{"name": "kimi", "node_rank": 0}, {"name": "chat"}]


def rank(host, number, **state):
    return dict({"host": host, "rank": number, "active": True, "restarts": 0, "fatal": [], "journal": []}, **state)


def test_the_service_passes_when_the_head_passed_and_every_rank_ran():
    verdict = service_nodes.group_verdict("kimi", {"passed": True}, [rank("ct200", 0), rank("ct129", 1)])
    assert verdict["passed"] is True


def test_a_dead_rank_fails_the_service_and_its_journal_is_named():
    dead = rank("ct129", 1, active=False, state="failed", journal=["RuntimeError: lab fault rank_crash"])
    head = {"passed": False, "failed_stage": "start", "msg": "the unit died"}
    verdict = service_nodes.group_verdict("kimi", head, [rank("ct200", 0, active=False), dead])
    assert verdict["passed"] is False
    assert verdict["failure_kind"] == service_nodes.RANK_FAILED
    assert verdict["failed_host"] == "ct129"
    assert "rank 1 on ct129 failed: its unit is not running (failed)" in verdict["msg"]
    assert "journal of sglang-kimi.service on ct129: RuntimeError: lab fault rank_crash" in verdict["msg"]


def test_a_rank_that_restarted_or_logged_a_fatal_line_fails_the_service_even_when_the_head_passed():
    restarted = service_nodes.group_verdict("kimi", {"passed": True}, [rank("ct129", 1, restarts=1)])
    fatal = service_nodes.group_verdict(
        "kimi", {"passed": True}, [rank("ct129", 1, fatal=["Scheduler hit an exception"])]
    )
    assert not restarted["passed"] and "restarted 1 time(s)" in restarted["msg"]
    assert not fatal["passed"] and "fatal line: Scheduler hit an exception" in fatal["msg"]


def test_the_heads_own_failure_is_the_verdict_when_every_worker_ran():
    head = {"passed": False, "failed_stage": "generate", "failure_kind": "timeout", "msg": "no token in 20 s"}
    verdict = service_nodes.group_verdict("kimi", head, [rank("ct129", 1)])
    assert verdict["passed"] is False and verdict["failed_stage"] == "generate"
    assert "the head's gate failed: no token in 20 s" in verdict["msg"]


def test_a_missing_head_gate_fails_the_service():
    assert service_nodes.group_verdict("kimi", None, [rank("ct129", 1)])["passed"] is False


# ---- the role's steps: start order across nodes, group facts, verdict inputs, gate results ----

HEAD = {"name": "kimi", "node_rank": 0, "node_hosts": ["ct200", "ct129"], "unit": "sglang-kimi.service"}
WORKER = dict(HEAD, node_rank=1)
CHAT = {"name": "chat", "node_rank": 0, "node_hosts": [], "unit": "sglang-chat.service"}


def restarted(entry):
    return dict(entry, state="restarted")


def started(entry):
    return dict(entry, state="started")


def test_a_service_restarted_on_one_node_restarts_on_every_node_workers_first():
    # ct200 restarts kimi (its head); ct129 was only to keep its worker running: it restarts it, first.
    order = service_nodes.node_start_order([started(WORKER), started(CHAT)], {"ct200": ["kimi"], "ct129": []})
    assert order == {"workers": [restarted(WORKER)], "rest": [started(CHAT)]}
    head = service_nodes.node_start_order([restarted(HEAD), restarted(CHAT)], {"ct200": ["kimi", "chat"], "ct129": []})
    assert head == {"workers": [], "rest": [restarted(HEAD), restarted(CHAT)]}


def test_a_service_of_one_host_is_not_restarted_for_another_hosts_restart():
    order = service_nodes.node_start_order([started(CHAT)], {"ct129": ["chat"]})
    assert order == {"workers": [], "rest": [started(CHAT)]}


def test_group_facts_and_problems_from_the_nodes_variables():
    def variables(stack):
        return {
            "sglang_services": [KIMI],
            "sglang_stack_active": {"id": stack},
            "sglang_service_releases": {"services": {"kimi": {"release_id": "r1"}}},
        }

    hostvars = {"ct200": variables("s1"), "ct129": variables("s2")}
    facts = service_nodes.group_facts(hostvars, ["ct200", "ct129", "gone"])
    assert sorted(facts) == ["ct129", "ct200"] and facts["ct129"]["release_ids"] == {"kimi": "r1"}
    found = service_nodes.group_problems("ct200", [HEAD, CHAT], facts, ["ct200", "ct129"], ["ct200", "ct129"])
    assert len(found) == 1 and "ct129 runs stack s2, ct200 runs s1" in found[0]
    # The worker's node says nothing: the head's node reports each problem once.
    assert service_nodes.group_problems("ct129", [WORKER], facts, ["ct200", "ct129"], ["ct200", "ct129"]) == []


def test_verdict_inputs_come_from_the_heads_gate_and_every_nodes_rank_check():
    hostvars = {
        "ct200": {
            "sglang_service_gate_run": {"results": [{"item": HEAD, "passed": True, "msg": "ok"}]},
            "sglang_service_rank_run": {"results": [dict(rank("ct200", 0), item=HEAD)]},
        },
        "ct129": {"sglang_service_rank_run": {"results": [dict(rank("ct129", 1, active=False), item=WORKER)]}},
    }
    inputs = service_nodes.verdict_inputs(WORKER, hostvars)
    assert inputs["head_gate"]["passed"] is True and inputs["hosts"] == ["ct200", "ct129"]
    assert [check["host"] for check in inputs["rank_checks"]] == ["ct200", "ct129"]
    verdict = service_nodes.group_verdict("kimi", **inputs)
    assert not verdict["passed"] and verdict["failed_host"] == "ct129"


def test_a_node_without_a_rank_check_fails_the_service():
    verdict = service_nodes.group_verdict("kimi", {"passed": True}, [rank("ct200", 0)], ["ct200", "ct129"])
    assert not verdict["passed"] and "rank 1 on ct129 was not checked" in verdict["msg"]


def test_gate_results_take_the_group_verdict_on_every_node():
    chat_result = {"item": CHAT, "passed": True}
    head_result = {"item": HEAD, "passed": True, "performance": {"tokens_per_second": 10}}
    failed = {"name": "kimi", "passed": False, "msg": "kimi: rank 1 on ct129 failed", "failed_host": "ct129"}
    head = service_nodes.node_gate_results([chat_result, head_result], [CHAT, dict(HEAD, release_id="r2")], [failed])
    assert head[0] == chat_result
    assert head[1]["passed"] is False and head[1]["failed_host"] == "ct129" and head[1]["release_id"] == "r2"
    assert head[1]["performance"] == {"tokens_per_second": 10}
    worker = service_nodes.node_gate_results([], [dict(WORKER, release_id="r2")], [failed])
    expected = {key: value for key, value in failed.items() if key != "name"}
    assert worker == [dict(expected, item=dict(WORKER, release_id="r2"), release_id="r2")]


def test_rollback_gates_and_serving_entries():
    rolled = [{"item": {"item": WORKER, "passed": False}, "release_id": "r1"}]
    assert service_nodes.rollback_gates(rolled) == [dict(WORKER, release_id="r1")]
    assert service_nodes.without_workers([HEAD, WORKER, CHAT, {"name": "x"}]) == [HEAD, CHAT, {"name": "x"}]


def test_rank_check_counts_restarts_and_fatal_lines():
    lines = ["Rank 1 joined", "sglang-kimi.service: Scheduled restart job, restart counter is at 1."]
    check = service_nodes.rank_check("ct129", 1, {"ActiveState": "active", "SubState": "running"}, lines, [])
    assert check["active"] and check["restarts"] == 1 and check["state"] == "active/running"
    # A start-up line of thousands of characters (SGLang's server_args=) is clipped in the evidence.
    long = service_nodes.rank_check("ct129", 1, {}, ["server_args=" + "x" * 20000], [])
    assert len(long["journal"][0]) < 1000


def test_ip_addresses_read_ip_json_loopback_included():
    text = (
        '[{"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1"}, {"family": "inet6", "local": "::1"}]},'
        ' {"ifname": "eth0", "addr_info": [{"family": "inet", "local": "10.88.0.2"}]}, {"ifname": "dummy0"}]'
    )
    assert service_nodes.ip_addresses(text) == ["127.0.0.1", "::1", "10.88.0.2"]
    assert service_nodes.ip_addresses("not json") is None
