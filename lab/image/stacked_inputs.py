"""List the files that decide the lab image with stacks (lab/image/build-stacked), one per line.

The image is what playbooks/stacks.yml leaves in a lab container, so its inputs are the playbooks and
roles that run, the inventories they read, and the collection's plugins those files name (with the
module_utils and plugin_utils they import, transitively). A change anywhere else in plugins/ (the health
gate, say) does not rebuild the image. Run from anywhere; paths are relative to the repository.
"""

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = [
    "roles/cuda_stack",
    "roles/sglang_stack",
    "playbooks/stacks.yml",
    "inventories/lab",
    "inventories/example/group_vars",
    "lab/up.yml",
    "lab/nvidia-smi",
    "lab/image/build-stacked",
    "lab/image/stacked_inputs.py",
]
PLUGIN_TYPES = ["modules", "action", "lookup", "filter", "test", "callback"]
NAMED = re.compile(r"\bddtree\.sglang\.([a-z_][a-z0-9_]*)")
IMPORTED = re.compile(r"ansible_collections\.ddtree\.sglang\.plugins\.(module_utils|plugin_utils)\.([a-z_][a-z0-9_]*)")


def files_under(path):
    if path.is_file():
        return [path]
    return [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]


def plugin_files(name):
    """The collection's plugins called `name` (a module and its action plugin share a name)."""
    return [
        REPO / "plugins" / kind / (name + ".py")
        for kind in PLUGIN_TYPES
        if (REPO / "plugins" / kind / (name + ".py")).is_file()
    ]


def inputs():
    chosen = set()
    pending = [f for root in ROOTS for f in files_under(REPO / root)]
    while pending:
        path = pending.pop()
        if path in chosen:
            continue
        chosen.add(path)
        text = path.read_text(encoding="utf-8", errors="replace")
        for name in NAMED.findall(text):
            pending.extend(plugin_files(name))
        for kind, name in IMPORTED.findall(text):
            candidate = REPO / "plugins" / kind / (name + ".py")
            if candidate.is_file():
                pending.append(candidate)
    return sorted(str(p.relative_to(REPO)) for p in chosen)


if __name__ == "__main__":
    sys.stdout.write("".join(line + "\n" for line in inputs()))
