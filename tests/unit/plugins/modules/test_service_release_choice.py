"""service_release_choice and the release module's base release, driven through main()."""

import json
import os

from conftest import run_module

from ansible_collections.ddtree.sglang.plugins.module_utils import release as release_utils
from ansible_collections.ddtree.sglang.plugins.modules import release, service_release_choice


def write_release(root, release_id, **manifest):
    path = os.path.join(root, release_id)
    os.makedirs(path)
    with open(os.path.join(path, release_utils.MANIFEST), "w") as handle:
        json.dump(dict(manifest, files={"site/x.py": "0"}, links={}), handle)


def test_choice_reads_the_hosts_manifests_and_fails_on_a_missing_pin(tmp_path, capsys):
    root = str(tmp_path)
    write_release(root, "aaaaaaaaaaaa", source_revision="5e1f3a2b9c0d", stack_id="s", overlay=True)
    write_release(root, "cccccccccccc", source_revision="none", stack_id="s", overlay=False)
    os.makedirs(os.path.join(root, "partial00000"))  # no manifest: never chosen
    services = [
        {"name": "coder", "algorithm": "DDTREE", "release": "5e1f3a2b9c0d"},
        {"name": "chat", "algorithm": "NEXTN", "release": "candidate"},
    ]
    args = {
        "services": services,
        "candidate_id": "bbbbbbbbbbbb",
        "base_id": "cccccccccccc",
        "stack_id": "s",
        "releases_root": root,
    }
    code, result = run_module(service_release_choice, args, capsys)
    assert code == 0 and result["changed"] is False
    assert result["services"]["coder"]["release_id"] == "aaaaaaaaaaaa"
    assert result["services"]["chat"]["release_dir"] == os.path.join(root, "cccccccccccc")
    # What pruning keeps: the releases chosen, the candidate and the base release.
    assert result["keep"] == ["aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"]
    code, result = run_module(
        service_release_choice, dict(args, services=[dict(services[0], release="partial00000")]), capsys
    )
    assert code == 1 and result["msg"].startswith(
        "1 release pin(s) cannot be met, nothing was changed: host: service coder pins release 'partial00000'"
    )
    code, result = run_module(service_release_choice, dict(args, base_id=None), capsys)
    assert (
        code == 1 and result["msg"] == "services chat do not load the overlay and need the base release: give base_id"
    )


def test_base_release_holds_the_stack_and_nothing_of_the_overlay(tmp_path, capsys):
    stack = tmp_path / "stacks" / "s1"
    (stack / "bin").mkdir(parents=True)
    args = {"root": str(tmp_path / "releases"), "overlay": False, "stack": str(stack), "stack_id": "s1"}
    code, result = run_module(release, args, capsys)
    assert code == 0 and result["changed"] is True and result["overlay"] is False
    assert result["release_id"] == release_utils.base_release_id("s1", [])
    path = result["release_dir"]
    assert sorted(os.listdir(path)) == ["kernel-cache", "manifest.json", "site", "stack"]
    assert os.listdir(os.path.join(path, "site")) == [] and os.readlink(os.path.join(path, "stack")) == str(stack)
    assert result["manifest"]["overlay"] is False and result["manifest"]["source_revision"] == "none"
    code, again = run_module(release, args, capsys)
    assert (
        code == 0
        and again["changed"] is False
        and again["release_id"] == result["release_id"]
        and again["overlay"] is False
    )
    code, result = run_module(release, dict(args, overlay=True), capsys)
    assert code == 1 and result["msg"].startswith("an overlay release needs wheel")
