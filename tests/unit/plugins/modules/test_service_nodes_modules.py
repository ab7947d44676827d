"""Services across hosts through the modules' main(): service_plan refuses a bad declaration naming the host,
the field and the fix, and plans each rank; service_node_verdict records the whole service's verdict."""

import copy
import json

from conftest import run_module

from ansible_collections.ddtree.sglang.plugins.modules import service_node_verdict, service_plan

KIMI = {
    "name": "kimi",
    "model_path": "/models/kimi",
    "draft_model_path": "/models/kimi-dflash",
    "gpus": [0, 1],
    "tp_size": 4,
    "port": 30000,
    "speculative": {"algorithm": "DDTREE", "budget": 15, "top_k": 8},
    "nodes": {"hosts": ["ct200", "ct129"], "dist_init_addr": "10.88.0.2", "interface": "eth0"},
}


def plan(capsys, host, service=None, **params):
    args = {"services": [copy.deepcopy(service or KIMI)], "gpu_indices": [0, 1], "host": host}
    args.update(interfaces=["lo", "eth0"], addresses=["127.0.0.1", "10.88.0.2" if host == "ct200" else "10.88.0.3"])
    args.update(params)
    return run_module(service_plan, args, capsys)


def test_each_node_is_planned_as_its_rank_with_the_default_dist_init_port(capsys):
    code, result = plan(capsys, "ct129")
    assert code == 0, result
    entry = result["services"][0]
    assert entry["node_rank"] == 1 and entry["node_hosts"] == ["ct200", "ct129"]
    assert "--node-rank 1 --dist-init-addr 10.88.0.2:20000" in entry["exec_args"]
    assert entry["environment"]["GLOO_SOCKET_IFNAME"] == "eth0"


def test_a_bad_declaration_is_refused_before_anything_changes(capsys):
    bad = copy.deepcopy(KIMI)
    bad["nodes"]["interface"] = "ib0"
    bad["nodes"]["dist_init_port"] = 30000
    code, result = plan(capsys, "ct129", service=bad)
    assert code == 1 and result["msg"].startswith("2 problem(s) in sglang_services, nothing was changed: ")
    assert (
        "ct129: sglang_services[0] (kimi): nodes.interface ib0 does not exist on ct129 (its interfaces: eth0, lo); "
        "set the interface of the network between the nodes" in result["problems"]
    )
    assert any(
        "nodes.dist_init_port 30000 collides with the HTTP port of service kimi" in p for p in result["problems"]
    )


def rank(host, number, **state):
    return dict({"host": host, "rank": number, "active": True, "restarts": 0, "fatal": [], "journal": []}, **state)


def test_the_verdict_of_the_whole_service_is_recorded_on_the_node(tmp_path, capsys):
    path = tmp_path / "kimi" / "verdicts.json"
    args = {
        "name": "kimi",
        "release_id": "r2",
        "head_gate": {"passed": True, "msg": "ok"},
        "rank_checks": [rank("ct200", 0), rank("ct129", 1, active=False, state="failed/failed", journal=["boom"])],
        "hosts": ["ct200", "ct129"],
        "verdict_file": str(path),
    }
    code, result = run_module(service_node_verdict, args, capsys)
    assert code == 0 and result["passed"] is False and result["failed_host"] == "ct129"
    record = json.loads(path.read_text())["verdicts"]["r2"]
    assert record["verdict"] == "failed" and record["failure_kind"] == "rank_failed"
    assert "rank 1 on ct129 failed" in record["msg"] and "boom" in record["msg"]
    code, result = run_module(service_node_verdict, dict(args, release_id="r3", _ansible_check_mode=True), capsys)
    assert code == 0 and "r3" not in json.loads(path.read_text())["verdicts"]
