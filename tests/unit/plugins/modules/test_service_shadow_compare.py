"""service_shadow_compare and service_release_choice's hold for a shadow, driven through main()."""

import json
import os

from conftest import run_module

from ansible_collections.ddtree.sglang.plugins.module_utils import release as release_utils
from ansible_collections.ddtree.sglang.plugins.modules import service_release_choice, service_shadow_compare

PROMPT = "List the first ten prime numbers, separated by commas."


def gate(release_id, text, tokens_per_second, accept_length):
    return {
        "passed": True,
        "release_id": release_id,
        "stage": "performance",
        "baseline": {"results": [{"prompt": PROMPT, "text": text}]},
        "performance": {"tokens_per_second": tokens_per_second, "accept_length": accept_length},
    }


def test_the_verdict_names_both_services_the_numbers_and_why(capsys):
    args = {
        "production": "coder",
        "shadow": "coder-shadow",
        "shadow_gate": gate("bbbbbbbbbbbb", "2, 3, 5", 80.0, 4.0),
        "production_gate": gate("aaaaaaaaaaaa", "2, 3, 5", 100.0, 4.0),
    }
    code, result = run_module(service_shadow_compare, args, capsys)
    assert code == 0 and result["changed"] is False and result["verdict"] == "held" and result["promote"] is False
    assert result["service"] == "coder" and result["shadow_service"] == "coder-shadow"
    assert result["msg"] == (
        "held: shadow coder-shadow on bbbbbbbbbbbb, production coder on aaaaaaaaaaaa (tokens/s 80.0 vs 100.0, "
        "acceptance 4.0 vs 4.0, 1 output(s) compared): tokens/s 80 is 20% below production's 100 "
        "(max_slowdown 0.1 allows down to 90)"
    )
    code, result = run_module(service_shadow_compare, dict(args, max_slowdown=0.25), capsys)
    assert code == 0 and result["verdict"] == "promoted" and result["problems"] == [] and result["max_slowdown"] == 0.25
    code, result = run_module(service_shadow_compare, dict(args, max_slowdown=1.0), capsys)
    assert code == 1 and result["msg"].startswith("max_slowdown is 1; it is a share of production's tokens/s")


def write_release(root, release_id):
    os.makedirs(os.path.join(root, release_id))
    with open(os.path.join(root, release_id, release_utils.MANIFEST), "w") as handle:
        json.dump(
            {"source_revision": "r" + release_id, "stack_id": "s", "overlay": True, "files": {}, "links": {}}, handle
        )


def test_the_choice_holds_a_production_service_on_the_release_its_current_link_names(tmp_path, capsys):
    releases, services_root = str(tmp_path / "releases"), tmp_path / "services"
    write_release(releases, "aaaaaaaaaaaa")
    (services_root / "coder").mkdir(parents=True)
    os.symlink(os.path.join(releases, "aaaaaaaaaaaa"), str(services_root / "coder" / "current"))
    services = [
        {"name": "coder", "algorithm": "DDTREE", "release": "candidate"},
        {"name": "coder-shadow", "algorithm": "DDTREE", "release": "candidate", "shadow_of": "coder"},
    ]
    args = {
        "services": services,
        "candidate_id": "bbbbbbbbbbbb",
        "releases_root": releases,
        "services_root": str(services_root),
    }
    code, result = run_module(service_release_choice, args, capsys)
    assert code == 0
    assert (
        result["services"]["coder"]["follows"] == "shadow"
        and result["services"]["coder"]["release_id"] == "aaaaaaaaaaaa"
    )
    assert result["services"]["coder"]["release_dir"] == os.path.join(releases, "aaaaaaaaaaaa")
    assert result["services"]["coder-shadow"]["release_id"] == "bbbbbbbbbbbb"
    assert result["keep"] == ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]
    # Without the shadow, the same host takes the candidate at once.
    code, result = run_module(service_release_choice, dict(args, services=services[:1]), capsys)
    assert code == 0 and result["services"]["coder"]["follows"] == "candidate"
