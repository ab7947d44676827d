"""The node_* filters the sglang_service role calls with hostvars: only the head's node reads the other nodes'
variables, and only for the services it heads."""

from ansible_collections.ddtree.sglang.plugins.filter import service_nodes as filters

HEAD = {"name": "kimi", "node_hosts": ["ct200", "ct129"], "node_rank": 0}


def variables(stack):
    return {
        "sglang_services": [{"name": "kimi"}],
        "sglang_stack_active": {"id": stack},
        "sglang_service_releases": {"services": {"kimi": {"release_id": "r1"}}},
    }


class Refusing(dict):
    """hostvars that fail the test when read."""

    def __getitem__(self, host):
        raise AssertionError("hostvars[%s] read" % host)


def test_the_head_compares_its_nodes():
    found = filters.node_group_problems(
        [HEAD], "ct200", {"ct200": variables("a"), "ct129": variables("b")}, ["ct200", "ct129"], ["ct200", "ct129"]
    )
    assert found == [
        "service kimi (nodes ct200, ct129): ct129 runs stack b, ct200 runs a; every node needs the same stack: "
        "give the nodes the same sglang_stack_pinset (and the same GPU generation's pins)"
    ]


def test_a_worker_or_a_host_of_single_host_services_reads_no_other_host():
    worker = dict(HEAD, node_rank=1)
    assert filters.node_group_problems([worker], "ct129", Refusing(), ["ct200", "ct129"], ["ct200", "ct129"]) == []
    assert (
        filters.node_group_problems([{"name": "chat", "node_hosts": []}], "ct200", Refusing(), ["ct200"], ["ct200"])
        == []
    )


def test_node_entries_and_serving():
    chat = {"name": "chat", "node_hosts": []}
    assert filters.node_entries([HEAD, chat, {"item": HEAD}]) == [HEAD, {"item": HEAD}]
    assert filters.node_entries([HEAD, chat], False) == [chat]
    assert filters.node_serving([HEAD, dict(HEAD, node_rank=1), chat]) == [HEAD, chat]
