"""Release manifests (tampering, partial releases) and the predicate-matrix comparison."""

import copy
import hashlib
import json
import os

from ansible_collections.ddtree.sglang.plugins.module_utils import release, spec_matrix


def make_tree(root):
    os.makedirs(os.path.join(root, "site", "pkg"))
    with open(os.path.join(root, "site", "pkg", "mod.py"), "w") as handle:
        handle.write("x = 1\n")
    os.symlink("/opt/sglang/stacks/abc", os.path.join(root, "stack"))


def test_manifest_round_trip_and_tampering(tmp_path):
    root = str(tmp_path / "r")
    make_tree(root)
    files, links = release.tree_hashes(root)
    assert set(files) == {"site/pkg/mod.py"} and links == {"stack": "/opt/sglang/stacks/abc"}
    manifest = {"files": files, "links": links}
    assert release.manifest_problems(manifest, files, links) == []
    with open(os.path.join(root, "site", "pkg", "mod.py"), "a") as handle:
        handle.write("import os\n")
    with open(os.path.join(root, "site", "pkg", "planted.py"), "w") as handle:
        handle.write("evil = True\n")
    os.remove(os.path.join(root, "stack"))
    os.symlink("/tmp/other", os.path.join(root, "stack"))
    problems = release.manifest_problems(manifest, *release.tree_hashes(root))
    assert problems[0].startswith("changed: site/pkg/mod.py (sha256 ")
    assert "added: site/pkg/planted.py" in problems
    assert "link stack -> /tmp/other, manifest says /opt/sglang/stacks/abc" in problems


def test_verify_release_partial_and_complete(tmp_path):
    root = str(tmp_path / "r")
    make_tree(root)
    assert release.verify_release(root) == ["no manifest (a partial or missing release)"]
    files, links = release.tree_hashes(root)
    with open(os.path.join(root, release.MANIFEST), "w") as handle:
        json.dump({"files": files, "links": links}, handle)
    assert release.verify_release(root) == []


def test_release_id_depends_on_source_stack_and_arch():
    base = release.release_id("src", "stack", "sm_120")
    assert len(base) == 12 and base == release.release_id("src", "stack", "sm_120")
    assert (
        len(
            {
                base,
                release.release_id("src2", "stack", "sm_120"),
                release.release_id("src", "stack2", "sm_120"),
                release.release_id("src", "stack", "sm_86"),
            }
        )
        == 4
    )


def test_extra_wheels_are_part_of_the_release_id_and_production_ids_stay():
    base = release.release_id("src", "stack", "cpu")
    # Without extra wheels (production), the id is what it was before extra wheels existed.
    assert base == hashlib.sha256(b"src\nstack\ncpu").hexdigest()[:12] == release.release_id("src", "stack", "cpu", [])
    lab = release.release_id("src", "stack", "cpu", ["a" * 64])
    assert len({base, lab, release.release_id("src", "stack", "cpu", ["b" * 64])}) == 3


PREDICATES = ["is_dflash", "is_dflash_family", "is_eagle", "is_speculative", "need_topk"]


def row(kind="builtin", known=True, **true):
    return {
        "kind": kind,
        "known": known,
        "predicates": {p: true.get(p, False) for p in PREDICATES},
        "behaviour": {"x": 1},
        "resolves_to": None,
    }


PRISTINE = {
    "algorithms": {
        "DFLASH": row(is_dflash=True, is_dflash_family=True, is_speculative=True),
        "EAGLE": row(is_eagle=True, is_speculative=True, need_topk=True),
        "DDTREE": {"kind": "unknown", "known": False},
    }
}
GOOD = {
    "algorithms": dict(
        PRISTINE["algorithms"], DDTREE=row(kind="plugin", is_dflash=True, is_dflash_family=True, is_speculative=True)
    )
}


def test_good_release_has_no_differences():
    assert spec_matrix.builtin_differences(PRISTINE, GOOD) == []
    assert spec_matrix.dflash_family_problems(GOOD) == []
    lines = spec_matrix.matrix_lines(PRISTINE, GOOD)
    assert lines[1].startswith("DDTREE") and lines[1].endswith("plugin")
    assert lines[3].startswith("EAGLE") and lines[3].endswith("same")


def test_release_that_changes_a_builtin_is_named():
    bad = copy.deepcopy(GOOD)
    bad["algorithms"]["EAGLE"]["predicates"]["need_topk"] = False
    assert spec_matrix.builtin_differences(PRISTINE, bad) == [
        "EAGLE.need_topk: True in pristine SGLang, False with the release"
    ]
    assert spec_matrix.matrix_lines(PRISTINE, bad)[3].endswith("DIFFERS")


def test_the_incident_plugin_not_dflash_family():
    broken = copy.deepcopy(GOOD)
    broken["algorithms"]["DDTREE"]["predicates"].update(is_dflash=False, is_dflash_family=False)
    problems = spec_matrix.dflash_family_problems(broken)
    assert "DDTREE.is_dflash is False, must be True" in problems
    assert "DDTREE.is_dflash_family is False, must be True" in problems


def test_plugin_not_loaded():
    assert spec_matrix.dflash_family_problems(PRISTINE) == [
        "DDTREE is not a known speculative algorithm with the release (is the plugin loaded?)"
    ]


def test_the_roles_summary_is_the_first_matrix_and_the_recorded_passes():
    results = [
        {"item": {"name": "coder"}, "matrix": ["algorithm ...", "DDTREE ... plugin"], "recorded": False},
        {"item": {"name": "chat"}, "matrix": ["other"], "recorded": True},
        {"item": {"name": "skipped"}, "skipped": True},
    ]
    assert spec_matrix.verify_summary(results) == [
        "algorithm ...",
        "DDTREE ... plugin",
        "recorded passes, not checked again: chat",
    ]
    assert spec_matrix.verify_summary(results[:1]) == ["algorithm ...", "DDTREE ... plugin"]
    assert spec_matrix.verify_summary([{"item": {"name": "coder"}, "skipped": True}]) == []
