"""What lab/up.yml gives each lab container, and what it says it did to each (lab only: nothing of it
ships with the collection).

A lab keeps its hosts: lab/up starts the containers that exist and recreates one only when its image or
its configuration changed (containers.podman.podman_container decides, comparing the container with the
task's options). So the options must describe a container the same way every time: an empty volume list
is left out, not passed as `[]`, which the module takes for a change ("volume - None" -> "volume -") and
recreates the container for on every run. lab_container_report turns the module's result into one line
per container that names what happened and, for a recreated one, why (the module's diff).
"""

from __future__ import annotations


def lab_container_volumes(build_dir: str, image_stacks_dir: str, mount_point: str) -> list:
    """The volumes of a lab container: the stacks' build directory, read-write (lab/image/build-stacked
    builds into it); else the stacks of an image from build-stacked, as an overlay of the host's own
    (podman's `:O`); else none (the plain image)."""
    if build_dir:
        return ["%s:%s" % (build_dir, mount_point)]
    if image_stacks_dir:
        return ["%s:%s:O" % (image_stacks_dir, mount_point)]
    return []


def _changed_settings(diff: dict) -> list:
    """The module's diff ("name - value" lines before and after) -> ["name: before -> after", ...]."""

    def lines(text):
        pairs = {}
        for line in (text or "").splitlines():
            name, separator, value = line.partition(" - ")
            if separator:
                pairs[name.strip()] = value.strip()
        return pairs

    before, after = lines((diff or {}).get("before")), lines((diff or {}).get("after"))
    return [
        "%s: %s -> %s" % (name, before.get(name, "(none)") or "(empty)", after.get(name, "(none)") or "(empty)")
        for name in sorted(set(before) | set(after))
        if before.get(name) != after.get(name)
    ]


def lab_container_line(result: dict) -> str:
    """One podman_container result (a loop item's, run with diff on) -> one line saying what happened."""
    container = result.get("container") or {}
    name = "%s (container %s)" % (result.get("item") or "?", container.get("Name") or "?")
    container_id = "id " + (container.get("Id") or "?")[:12]
    actions = " ".join(result.get("actions") or [])
    # The podman commands it ran tell a new container ("podman run") from a stopped one started again
    # ("podman start"): the module says "started" for both.
    commands = [" ".join(str(command).split()[:2]) for command in result.get("podman_actions") or []]
    if result.get("failed"):
        return "%s: failed: %s" % (name, result.get("msg", "no message"))
    if "recreated" in actions:
        changes = _changed_settings(result.get("diff"))
        why = "; ".join(changes) if changes else "the module found it different (no diff given)"
        return "%s: recreated (%s), because its image or configuration changed: %s" % (name, container_id, why)
    if "podman run" in commands or "podman create" in commands:
        return "%s: created (%s): there was no such container" % (name, container_id)
    if "podman start" in commands or "podman restart" in commands:
        return "%s: started (%s): it existed, stopped; kept with its files" % (name, container_id)
    return "%s: kept (%s): running, same image and configuration" % (name, container_id)


def lab_container_report(results: list) -> list:
    """The results of lab/up.yml's container task (its loop's `results`) -> a line per container."""
    return [lab_container_line(result) for result in results or [] if not result.get("skipped")]


class FilterModule:
    """Filters of lab/up.yml."""

    def filters(self):
        return {"lab_container_volumes": lab_container_volumes, "lab_container_report": lab_container_report}
