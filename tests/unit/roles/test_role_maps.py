"""The mappings the roles take: those whose keys the role knows declare them (a misspelt key is refused before the
role's first task), those whose keys are the fleet's own say so in their argument spec."""

import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "unit"))
from playbook_run import run_playbook  # noqa: E402


def spec(role):
    return yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"][
        "main"
    ]["options"]


def test_the_driver_packages_declare_each_driver_source_and_the_defaults_fill_them():
    options = spec("cuda_stack")
    declared = options["cuda_stack_driver_packages"]["options"]
    assert sorted(declared) == sorted(options["cuda_stack_driver_source"]["choices"])
    assert all((field["type"], field["elements"]) == ("list", "str") for field in declared.values())
    defaults = yaml.safe_load((REPO / "roles" / "cuda_stack" / "defaults" / "main.yml").read_text())
    assert sorted(defaults["cuda_stack_driver_packages"]) == sorted(declared)


def test_the_maps_of_the_fleets_own_names_say_why_they_declare_no_keys():
    for role, name in (("cuda_stack", "cuda_stack_ffmpeg_packages"), ("rollout_pull", "rollout_pull_environment")):
        declared = spec(role)[name]
        assert declared["type"] == "dict" and "options" not in declared
        assert "not declared" in " ".join(declared["description"]), name


def test_a_misspelt_driver_source_is_refused_before_the_roles_first_task(tmp_path):
    playbook = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {"cuda_stack_driver_packages": {"nvidai": ["nvidia-open-580"]}},
            "roles": ["ddtree.sglang.cuda_stack"],
        }
    ]
    # No interpreter: the argument spec is checked on the controller, and no task of the role can run here.
    returncode, output = run_playbook(tmp_path, playbook, interpreter="/nonexistent/python3")
    assert returncode == 2, output[-3000:]
    assert "cuda_stack_driver_packages.nvidai. Supported parameters include: distribution, nvidia" in output, output
    assert "ok=0" in output.split("PLAY RECAP", 1)[1]
