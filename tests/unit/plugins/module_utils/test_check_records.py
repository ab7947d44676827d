"""Recorded passes of the stack checks: keys, fingerprints, records written whole and read back."""

import json
import os

from ansible_collections.ddtree.sglang.plugins.module_utils import check_records

CODE = ("ansible_collections.ddtree.sglang.plugins.module_utils.check_records",)


def make_stack(root):
    stack = root / "stack"
    site = stack / "lib" / "python3.11" / "site-packages"
    (site / "torch-2.9.0.dist-info").mkdir(parents=True)
    (site / "torch-2.9.0.dist-info" / "RECORD").write_text("torch/__init__.py,,\n")
    (site / "torch").mkdir()
    (site / "distutils-precedence.pth").write_text("import os\n")
    (stack / check_records.STACK_MARKER).write_text('{"id": "3f2a9c1d0b7e"}\n')
    return str(stack)


def make_release(root, name="release"):
    release = root / name
    (release / "site" / "sglang_overlay").mkdir(parents=True)
    (release / "site" / "sglang_overlay" / "tree.py").write_text("x = 1\n")
    (release / "kernel-cache").mkdir()
    (release / check_records.RELEASE_MANIFEST).write_text('{"files": {}}\n')
    return str(release)


def test_the_key_covers_every_input_the_code_and_the_check():
    inputs = {"flags": ["--port", "1"], "environment": {"A": "1", "B": "2"}}
    key = check_records.record_key("spec_verify", "code1", inputs)
    assert key == check_records.record_key(
        "spec_verify", "code1", {"environment": {"B": "2", "A": "1"}, "flags": ["--port", "1"]}
    )
    assert key != check_records.record_key("spec_verify", "code2", inputs)
    assert key != check_records.record_key("stack_verify", "code1", inputs)
    assert key != check_records.record_key("spec_verify", "code1", dict(inputs, flags=["--port", "2"]))
    assert key != check_records.record_key("spec_verify", "code1", dict(inputs, environment={"A": "1"}))


def test_a_tampered_or_rebuilt_release_is_a_new_fingerprint_but_its_kernel_cache_is_not(tmp_path):
    release = make_release(tmp_path)
    before = check_records.release_fingerprint(release)
    assert before == check_records.release_fingerprint(release)
    (tmp_path / "release" / "kernel-cache" / "kernel.bin").write_text("compiled at run time")
    assert check_records.release_fingerprint(release) == before
    with open(os.path.join(release, "site", "sglang_overlay", "tree.py"), "a") as handle:
        handle.write("# tampered\n")  # the Molecule scenario's tamper: same name, one more line
    assert check_records.release_fingerprint(release)["site"] != before["site"]
    os.unlink(os.path.join(release, check_records.RELEASE_MANIFEST))
    assert check_records.release_fingerprint(release)["manifest"] is None


def test_a_package_changed_in_the_stack_is_a_new_fingerprint(tmp_path):
    stack = make_stack(tmp_path)
    site = tmp_path / "stack" / "lib" / "python3.11" / "site-packages"
    before = check_records.stack_fingerprint(stack)
    assert before["marker"] and before == check_records.stack_fingerprint(stack)
    (site / "torch-2.9.0.dist-info" / "RECORD").write_text("torch/__init__.py,,\ntorch/extra.py,,\n")
    upgraded = check_records.stack_fingerprint(stack)
    assert upgraded != before
    (site / "sitecustomize.py").write_text("import evil\n")
    assert check_records.stack_fingerprint(stack) != upgraded
    os.unlink(os.path.join(stack, check_records.STACK_MARKER))
    assert check_records.stack_fingerprint(stack)["marker"] is None


def test_a_stack_keeps_its_fingerprint_when_an_image_layer_cuts_its_mtimes_to_whole_seconds(tmp_path):
    stack = make_stack(tmp_path)
    record = tmp_path / "stack" / "lib" / "python3.11" / "site-packages" / "torch-2.9.0.dist-info" / "RECORD"
    os.utime(record, ns=(1_700_000_000_123_456_789, 1_700_000_000_123_456_789))
    built = check_records.stack_fingerprint(stack)
    os.utime(record, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))  # podman commit, tar
    assert check_records.stack_fingerprint(stack) == built
    os.utime(record, ns=(1_700_000_001_000_000_000, 1_700_000_001_000_000_000))  # rewritten a second later
    assert check_records.stack_fingerprint(stack) != built


def test_code_version_reads_the_source_and_gives_up_on_unknown_code():
    version = check_records.code_version(CODE)
    assert version and version == check_records.code_version(CODE)
    assert version != check_records.code_version(CODE + ("json",))
    assert check_records.code_version(CODE + ("no_such_module_xyz",)) is None


def test_a_record_is_written_whole_read_back_and_only_for_its_check_and_key(tmp_path):
    path = check_records.record_path(str(tmp_path), "spec_verify", "k1")
    assert path == str(tmp_path / "_checks" / "spec_verify" / "k1.json")
    assert check_records.read_record(path, "spec_verify", "k1") is None
    check_records.write_record(path, "spec_verify", "k1", {"matrix": ["a"]}, "2026-12-01T00:00:00Z")
    assert os.listdir(os.path.dirname(path)) == ["k1.json"]  # no temporary left behind
    record = check_records.read_record(path, "spec_verify", "k1")
    assert record["result"] == {"matrix": ["a"]} and record["recorded_at"] == "2026-12-01T00:00:00Z"
    assert check_records.read_record(path, "spec_verify", "k2") is None
    assert check_records.read_record(path, "stack_verify", "k1") is None
    with open(path, "w") as handle:
        handle.write('{"format": 1, "check": "spec_verify", "key": "k1"')  # cut short
    assert check_records.read_record(path, "spec_verify", "k1") is None


def test_old_records_are_pruned(tmp_path):
    for number in range(4):
        path = check_records.record_path(str(tmp_path), "stack_verify", "k%d" % number)
        check_records.write_record(path, "stack_verify", "k%d" % number, {}, "t", keep=2)
        os.utime(path, ns=(number * 10**9, number * 10**9))
    check_records.prune_records(os.path.dirname(path), 2)
    assert sorted(os.listdir(os.path.dirname(path))) == ["k2.json", "k3.json"]


def test_find_record_records_nothing_without_a_state_root_or_for_unfinished_things(tmp_path):
    assert check_records.find_record(None, "spec_verify", CODE, {}, complete=True) is None
    assert check_records.find_record(str(tmp_path), "spec_verify", CODE, {}, complete=False) is None
    assert (
        check_records.find_record(str(tmp_path), "spec_verify", CODE + ("no_such_module_xyz",), {}, complete=True)
        is None
    )
    slot = check_records.find_record(str(tmp_path), "spec_verify", CODE, {"a": 1}, complete=True)
    assert slot["record"] is None and slot["path"].endswith(slot["key"] + ".json")
    check_records.write_record(slot["path"], "spec_verify", slot["key"], {"matrix": []}, "t")
    again = check_records.find_record(str(tmp_path), "spec_verify", CODE, {"a": 1}, complete=True)
    result = check_records.recorded_result(again)
    assert result["recorded"] is True and result["changed"] is False and result["matrix"] == []
    assert "not checked again" in result["msg"] and json.loads(json.dumps(result)) == result


def test_a_pass_is_recorded_with_its_place_but_not_in_check_mode_nor_without_a_slot(tmp_path):
    slot = check_records.find_record(str(tmp_path), "stack_verify", CODE, {"a": 1}, complete=True)
    result = check_records.record_pass(slot, "stack_verify", {"facts": {}}, check_mode=True)
    assert result == {"facts": {}, "record": slot["path"]} and not os.path.exists(slot["path"])
    result = check_records.record_pass(slot, "stack_verify", {"facts": {}}, check_mode=False)
    assert result == {"facts": {}, "record": slot["path"]}
    # The record holds the check's result as it was, without the place it is recorded in.
    assert check_records.read_record(slot["path"], "stack_verify", slot["key"])["result"] == {"facts": {}}
    assert check_records.record_pass(None, "stack_verify", {"facts": {}}, check_mode=False) == {"facts": {}}
