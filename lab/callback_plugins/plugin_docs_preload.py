"""Parse the connection and lookup plugins' option docs once per run, not once per task (lab and tests only).

ansible-core learns a plugin's options by parsing the YAML of its DOCUMENTATION the first time the plugin is
loaded in a process. The SSH connection, and the lookups the lab inventory's connection variables use,
are first loaded in the worker process that runs a task, forked from the main process, which never loads
them itself: so every task parsed the SSH plugin's documentation (with its fragments) again, and forgot
it when its worker exited. That was about an eighth of the controller's CPU in a lab converge (py-spy);
a no-change site.yml on the two lab hosts: 34-37 -> 27-28 controller CPU-seconds. Loading them here, in
the main process before any worker forks, leaves the parsed definitions in the configuration every
worker inherits: the same definitions the worker would have parsed. Loaded by scripts/test for the lab
stages, like task_times; nothing of it ships with the collection.
"""

from __future__ import annotations

DOCUMENTATION = """
name: plugin_docs_preload
type: aggregate
short_description: Parse the connection and lookup plugins' option docs once per run (lab and tests only)
description:
  - Loads the ssh and local connection plugins and the lookups the lab's variables use in the main process,
    so that forked workers inherit their parsed option definitions.
options: {}
"""

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import connection_loader, lookup_loader

# Under the names tasks spell them with: a plugin's definitions are kept under the name it was loaded by
# ("ssh" and "ansible.builtin.ssh" are two entries), so both spellings are loaded.
PRELOADED = (
    (connection_loader, ("ssh", "ansible.builtin.ssh", "local", "ansible.builtin.local")),
    # What the lab inventory's connection variables and the roles' variables look up on every task
    # (inventories/lab/group_vars/lab.yml, roles/sglang_stack/vars/main.yml).
    (lookup_loader, ("ansible.builtin.env", "ansible.builtin.file", "ansible.builtin.pipe", "ddtree.sglang.cache_dir")),
)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "plugin_docs_preload"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self):
        super().__init__()
        for loader, names in PRELOADED:
            for name in names:
                loader.get(name, class_only=True)
