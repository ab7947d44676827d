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
IFACES = ["lo", "eth0"]
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
    return services.service_problems([service, *others], [0, 1], host, interfaces, addresses)


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


def facts(service=KIMI, stack="s1", release="r1"):
    return {"service": service, "stack_id": stack, "release_id": release}


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
