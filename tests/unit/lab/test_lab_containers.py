"""lab/up keeps the lab's hosts: its container options describe a container the same way every time, and it
says in one line per container what it did and why (lab/filter_plugins/lab_containers.py)."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("lab_containers", REPO / "lab" / "filter_plugins" / "lab_containers.py")
lab_containers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab_containers)

CONTAINER = {"Name": "ddtree-lab-1-ct200", "Id": "fcc9a195f70b0123456789"}


def result(actions, podman_actions, **more):
    """A containers.podman.podman_container loop result, as the module returns it with diff on."""
    return {
        "item": "ct200",
        "changed": bool(actions),
        "actions": actions,
        "podman_actions": podman_actions,
        "container": CONTAINER,
        **more,
    }


def test_the_plain_image_gets_no_volume_option_at_all():
    # `[]` would be "volume -" against the container's "volume - None": a change, so a recreate every time.
    assert lab_containers.lab_container_volumes("", "", "/opt/sglang/stacks") == []
    assert lab_containers.lab_container_volumes("", "/c/stacks-1/stacks", "/opt/sglang/stacks") == [
        "/c/stacks-1/stacks:/opt/sglang/stacks:O"
    ]
    assert lab_containers.lab_container_volumes("/b/stacks", "/c/stacks-1/stacks", "/opt/sglang/stacks") == [
        "/b/stacks:/opt/sglang/stacks"
    ]


def test_a_running_container_with_the_same_image_and_configuration_is_kept():
    line = lab_containers.lab_container_line(result([], []))
    assert line == "ct200 (container ddtree-lab-1-ct200): kept (id fcc9a195f70b): running, same image and configuration"


def test_a_stopped_container_is_started_not_recreated():
    line = lab_containers.lab_container_line(
        result(["started ddtree-lab-1-ct200"], ["podman start ddtree-lab-1-ct200"])
    )
    assert "started (id fcc9a195f70b): it existed, stopped; kept with its files" in line


def test_a_new_container_is_created():
    line = lab_containers.lab_container_line(
        result(["started ddtree-lab-1-ct200"], ["podman run --name ddtree-lab-1-ct200 --detach image /sbin/init"])
    )
    assert "created (id fcc9a195f70b): there was no such container" in line


def test_a_recreated_container_names_what_changed():
    diff = {
        "before": "image - ddtree-lab-host:66c0e1df45a6\nvolume - None\n",
        "after": "image - ddtree-lab-host:66eb36362ab0\nvolume - /s:/opt/sglang/stacks:O\n",
    }
    line = lab_containers.lab_container_line(
        result(["recreated ddtree-lab-1-ct200"], ["podman rm -f ddtree-lab-1-ct200", "podman run ..."], diff=diff)
    )
    assert line == (
        "ct200 (container ddtree-lab-1-ct200): recreated (id fcc9a195f70b), because its image or configuration "
        "changed: image: ddtree-lab-host:66c0e1df45a6 -> ddtree-lab-host:66eb36362ab0; "
        "volume: None -> /s:/opt/sglang/stacks:O"
    )


def test_a_recreate_without_a_diff_still_says_so():
    line = lab_containers.lab_container_line(
        result(["recreated ddtree-lab-1-ct200"], ["podman rm -f x", "podman run x"])
    )
    assert "recreated" in line and "no diff given" in line


def test_the_report_has_a_line_per_container_and_skips_hosts_not_in_the_run():
    lines = lab_containers.lab_container_report([result([], []), {"item": "ct129", "skipped": True}])
    assert len(lines) == 1 and lines[0].startswith("ct200")
