"""The fleet's baselines: the reference of a host that has none, and how hosts add to them."""

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils.fleet_baselines import (
    check_document,
    fleet_add,
    overall_reference,
    reference_for,
)

KEY = "qwen3-coder | DFLASH | tp 2 | sglang 0.5.23"
PROMPT = "List the first ten prime numbers, separated by commas."


def document(text, key=KEY, prompt=PROMPT, **entry):
    return {"format": 2, "baselines": {key: {"64": {prompt: dict({"text": text, "release_id": "r1"}, **entry)}}}}


def test_the_host_comes_first_then_the_fleet_then_nothing():
    assert reference_for(document("mine"), document("fleet's"), KEY, PROMPT, 64) == (
        {"text": "mine", "release_id": "r1"},
        "host",
    )
    assert reference_for(None, document("fleet's"), KEY, PROMPT, 64)[1] == "fleet"
    assert reference_for(document("mine", key="other"), document("fleet's", key="other"), KEY, PROMPT, 64) == (
        None,
        "none",
    )
    # Another max_tokens is another baseline.
    assert reference_for(None, document("fleet's"), KEY, PROMPT, 32) == (None, "none")


@pytest.mark.parametrize(
    "sources, word",
    [
        ([], "none"),
        (["none", "none"], "none"),
        (["host", "host"], "host"),
        (["host", "fleet"], "fleet"),
        (["fleet", "none"], "partial"),
    ],
)
def test_one_word_for_the_references_of_a_gate(sources, word):
    assert overall_reference(sources) == word


def test_a_hosts_new_baselines_are_added_where_the_fleet_has_none_and_never_replace_its_entries():
    fleet = document("the fleet's", host="ct201")
    new = document("ct200's", recorded_at="t")
    new["baselines"][KEY]["64"]["Another prompt"] = {"text": "another", "release_id": "r2", "recorded_at": "t2"}
    new["baselines"]["other key"] = {"32": {PROMPT: {"text": "other", "release_id": "r2"}}}
    merged, added = fleet_add(fleet, new, "ct200")
    assert merged["baselines"][KEY]["64"][PROMPT] == {"text": "the fleet's", "release_id": "r1", "host": "ct201"}
    assert merged["baselines"][KEY]["64"]["Another prompt"]["host"] == "ct200"
    assert merged["baselines"]["other key"]["32"][PROMPT]["text"] == "other"
    assert sorted(added, key=str) == sorted(
        [
            {"key": KEY, "max_tokens": 64, "prompt": "Another prompt"},
            {"key": "other key", "max_tokens": 32, "prompt": PROMPT},
        ],
        key=str,
    )
    assert fleet["baselines"][KEY]["64"].keys() == {PROMPT}  # the input is not changed


def test_nothing_new_adds_nothing():
    fleet = document("the fleet's", host="ct201")
    assert fleet_add(fleet, document("ct200's"), "ct200") == (fleet, [])
    assert fleet_add(None, None, "ct200") == ({"format": 2, "baselines": {}}, [])


@pytest.mark.parametrize(
    "bad, says",
    [
        ([1, 2], "is not a baselines document"),
        ({"format": 1, "baselines": {}}, "has format 1; this collection reads format 2"),
        ({"format": 2, "baselines": {KEY: {"64": {PROMPT: "text"}}}}, "the entries of key %r (max_tokens 64)" % KEY),
        ({"format": 2, "baselines": {KEY: ["x"]}}, "the entries of key %r" % KEY),
    ],
)
def test_a_document_that_is_not_one_is_named_with_what_is_wrong(bad, says):
    with pytest.raises(ValueError, match="^the fleet file .*") as raised:
        check_document(bad, "the fleet file /c/fleet.json")
    assert says in str(raised.value)
