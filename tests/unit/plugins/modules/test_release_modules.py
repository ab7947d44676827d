"""service_link, service_release_info, release_prune and service_plan driven through main()."""

import json
import os

from conftest import run_module

from ansible_collections.ddtree.sglang.plugins.module_utils import release as release_utils
from ansible_collections.ddtree.sglang.plugins.modules import service_link, service_plan


def make_release(root, release_id, content="x = 1\n"):
    path = os.path.join(root, "releases", release_id)
    os.makedirs(os.path.join(path, "site"))
    with open(os.path.join(path, "site", "mod.py"), "w") as handle:
        handle.write(content)
    files, links = release_utils.tree_hashes(path)
    with open(os.path.join(path, release_utils.MANIFEST), "w") as handle:
        json.dump({"files": files, "links": links}, handle)
    return path


def link_args(root, **extra):
    return dict(
        {
            "service": "coder",
            "services_root": os.path.join(root, "services"),
            "releases_root": os.path.join(root, "releases"),
        },
        **extra,
    )


def target(root, link):
    return os.readlink(os.path.join(root, "services", "coder", link))


def test_switch_then_rollback(tmp_path, capsys):
    root = str(tmp_path)
    make_release(root, "aaa")
    make_release(root, "bbb")
    code, result = run_module(service_link, link_args(root, release_id="aaa"), capsys)
    assert code == 0 and result["changed"] and result["release_id"] == "aaa" and result["previous_release_id"] is None
    code, result = run_module(service_link, link_args(root, release_id="aaa"), capsys)
    assert result["changed"] is False
    code, result = run_module(service_link, link_args(root, release_id="bbb", _ansible_diff=True), capsys)
    assert (result["release_id"], result["previous_release_id"]) == ("bbb", "aaa")
    assert result["diff"]["before"] == "current -> aaa\nprevious -> None\n"
    assert target(root, "current") == "../../releases/bbb" and target(root, "previous") == "../../releases/aaa"
    code, result = run_module(service_link, link_args(root, state="previous"), capsys)
    assert (result["release_id"], result["previous_release_id"]) == ("aaa", "bbb")
    assert target(root, "current") == "../../releases/aaa"


def test_check_mode_changes_nothing(tmp_path, capsys):
    root = str(tmp_path)
    make_release(root, "aaa")
    code, result = run_module(service_link, link_args(root, release_id="aaa", _ansible_check_mode=True), capsys)
    assert result["changed"] and not os.path.lexists(os.path.join(root, "services", "coder", "current"))


def test_check_mode_plans_a_release_not_built_yet_but_never_activates_a_missing_one(tmp_path, capsys):
    root = str(tmp_path)
    code, result = run_module(service_link, link_args(root, release_id="new", _ansible_check_mode=True), capsys)
    assert (
        code == 0
        and result["changed"]
        and result["release_id"] == "new"
        and "not built yet" in json.dumps(result["warnings"])
    )
    code, result = run_module(service_link, link_args(root, release_id="new"), capsys)
    assert code == 1 and "will not be activated" in result["msg"]


def test_tampered_or_partial_release_is_never_activated(tmp_path, capsys):
    root = str(tmp_path)
    path = make_release(root, "aaa")
    with open(os.path.join(path, "site", "mod.py"), "a") as handle:
        handle.write("planted = True\n")
    code, result = run_module(service_link, link_args(root, release_id="aaa"), capsys)
    assert code == 1 and "release aaa will not be activated for coder: changed: site/mod.py" in result["msg"]
    os.makedirs(os.path.join(root, "releases", "partial"))
    code, result = run_module(service_link, link_args(root, release_id="partial"), capsys)
    assert code == 1 and "no manifest" in result["msg"]
    assert not os.path.lexists(os.path.join(root, "services", "coder", "current"))


def test_rollback_without_previous(tmp_path, capsys):
    code, result = run_module(service_link, link_args(str(tmp_path), state="previous"), capsys)
    assert code == 1 and result["msg"] == "service coder has no previous release to go back to"


SERVICE = {
    "name": "coder",
    "model_path": "/m",
    "draft_model_path": "/d",
    "gpus": [0, 1],
    "tp_size": 2,
    "port": 30000,
    "speculative": {"algorithm": "DDTREE", "budget": 15},
    "api_key": "s3cret-key",
}


def test_plan_renders_units_without_the_secret(capsys):
    code, result = run_module(
        service_plan, {"services": [SERVICE], "gpu_indices": list(range(8)), "host": "ct200"}, capsys
    )
    assert code == 0
    plan = result["services"][0]
    assert plan["unit"] == "sglang-coder.service" and plan["environment"] == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert "--api-key" not in plan["exec_args"] and plan["has_api_key"] is True
    assert "s3cret-key" not in json.dumps(result)


def test_plan_lists_every_problem_before_any_change(capsys):
    services = [
        dict(SERVICE, gpus=[9], tp_size=1),
        dict(SERVICE, name="chat", port=30000, speculative={"algorithm": "DDTREE", "budget": 0}),
    ]
    code, result = run_module(
        service_plan, {"services": services, "gpu_indices": list(range(8)), "host": "ct200"}, capsys
    )
    assert code == 1 and result["msg"].startswith("3 problem(s) in sglang_services, nothing was changed")
    assert any("GPU index 9 does not exist on ct200" in p for p in result["problems"])
    assert any("port 30000 is also used by service coder" in p for p in result["problems"])
    assert any("speculative.budget: the budget is 0" in p for p in result["problems"])


def test_release_prune_keeps_current_previous_and_keep(tmp_path, capsys):
    from ansible_collections.ddtree.sglang.plugins.modules import release_prune

    root = str(tmp_path)
    for release_id in ("aaa", "bbb", "ccc", "ddd"):
        make_release(root, release_id)
    run_module(service_link, link_args(root, release_id="aaa"), capsys)
    run_module(service_link, link_args(root, release_id="bbb"), capsys)
    args = {"root": os.path.join(root, "releases"), "services_root": os.path.join(root, "services"), "keep": ["ccc"]}
    code, result = run_module(release_prune, dict(args, _ansible_check_mode=True, _ansible_diff=True), capsys)
    assert result["removed"] == ["ddd"] and result["diff"]["after"] == "aaa\nbbb\nccc\n"
    assert os.path.isdir(os.path.join(root, "releases", "ddd"))
    code, result = run_module(release_prune, args, capsys)
    assert sorted(os.listdir(os.path.join(root, "releases"))) == ["aaa", "bbb", "ccc"]
    assert result["in_use"] == {"bbb": ["coder/current"], "aaa": ["coder/previous"]}


def test_plan_resolves_each_services_gate_settings(capsys):
    slow = dict(SERVICE, health={"start_timeout": 1800})
    code, result = run_module(
        service_plan,
        {
            "services": [slow, dict(SERVICE, name="chat", port=30001, gpus=[2], tp_size=1)],
            "gpu_indices": list(range(8)),
            "gate_defaults": {"start_timeout": 900, "no_progress_timeout": 120},
        },
        capsys,
    )
    assert code == 0
    assert [entry["gate"] for entry in result["services"]] == [
        {"start_timeout": 1800, "no_progress_timeout": 120},
        {"start_timeout": 900, "no_progress_timeout": 120},
    ]


def test_plan_refuses_an_unknown_health_setting(capsys):
    code, result = run_module(
        service_plan,
        {"services": [dict(SERVICE, health={"start_timout": 1800})], "gpu_indices": list(range(8))},
        capsys,
    )
    assert code == 1 and "start_timout" in result["msg"]


def test_links_follow_releases_root_wherever_it_is_and_are_read_back_by_one_reader(tmp_path, capsys):
    from ansible_collections.ddtree.sglang.plugins.modules import release_prune, service_release_info

    releases_root = str(tmp_path / "data" / "overlay-releases")
    services_root = str(tmp_path / "opt" / "services")
    for release_id in ("aaa", "bbb"):
        make_release(str(tmp_path / "data"), release_id)
    os.rename(str(tmp_path / "data" / "releases"), releases_root)
    args = {"service": "coder", "services_root": services_root, "releases_root": releases_root}
    for release_id in ("aaa", "bbb"):
        code, result = run_module(service_link, dict(args, release_id=release_id), capsys)
        assert code == 0, result
    link = os.path.join(services_root, "coder", "current")
    assert os.readlink(link) == "../../../data/overlay-releases/bbb"  # relative, so the tree moves whole
    assert os.path.realpath(link) == os.path.join(os.path.realpath(releases_root), "bbb")
    code, result = run_module(
        service_release_info, {"services": ["coder", "chat"], "services_root": services_root}, capsys
    )
    assert result["services"] == {
        "coder": {"release_id": "bbb", "previous_release_id": "aaa"},
        "chat": {"release_id": None, "previous_release_id": None},
    }
    code, result = run_module(
        release_prune,
        {"root": releases_root, "services_root": services_root, "keep": [], "_ansible_check_mode": True},
        capsys,
    )
    assert result["in_use"] == {"bbb": ["coder/current"], "aaa": ["coder/previous"]} and result["removed"] == []


def test_plan_carries_each_services_release_and_shadow(capsys):
    shadow = dict(SERVICE, name="coder-shadow", gpus=[4, 5], port=30100, shadow_of="coder")
    shadow.pop("api_key", None)
    code, result = run_module(service_plan, {"services": [SERVICE, shadow], "gpu_indices": list(range(8))}, capsys)
    assert code == 0
    assert [(entry["release"], entry["shadow_of"], entry["loads_overlay"]) for entry in result["services"]] == [
        ("candidate", None, True),
        ("candidate", "coder", True),
    ]
    code, result = run_module(
        service_plan, {"services": [SERVICE, dict(shadow, gpus=[1, 2])], "gpu_indices": [0, 1, 2]}, capsys
    )
    assert (
        code == 1
        and "a shadow needs spare GPUs of its own, but GPU 1 is used by service coder; give it spare GPUs (free on host: 2)"
        in result["msg"]
    )
