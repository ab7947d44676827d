#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: service_files
short_description: Write the files an SGLang service's unit starts with, and say which changed
version_added: 0.1.0
description:
  - Writes a service's state directory (owned by the services' account), its environment file, its API key file
    (root's alone; systemd opens it as the server's standard input) and its systemd unit, each only when it
    differs from what is on the host. A service without an API key has no key file; one left from before is removed.
  - The unit and environment are rendered by the caller from the role's templates (the
    C(ansible.builtin.template) lookup), as a tuning's temporary instance is (M(ddtree.sglang.service_autotune_trial)).
  - RV(changes) says which files changed, so M(ddtree.sglang.service_actions) restarts the services that read them.
  - The decisions are plain functions in C(plugins/module_utils/service_files.py).
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  name:
    description: The service's name (its files are named after it).
    type: str
    required: true
  unit:
    description: The service's unit name, e.g. C(sglang-coder.service).
    type: str
    required: true
  unit_file:
    description: The unit's text.
    type: str
    required: true
  environment_file:
    description:
      - The environment file's text (never the API key). It may hold tokens, so Ansible never logs it on the host;
        with C(--diff) its changes are shown, as M(ansible.builtin.template) shows them.
    type: str
    required: true
  api_key:
    description: The service's API key; unset or empty when it has none (its key file is removed).
    type: str
  config_dir:
    description: Where the environment and API key files live.
    type: path
    required: true
  state_root:
    description: Where each service's state directory lives.
    type: path
    required: true
  systemd_dir:
    description: Where the unit is written.
    type: path
    default: /etc/systemd/system
  owner:
    description: The services' account, which owns the state directory.
    type: str
    required: true
  group:
    description: The services' group.
    type: str
    required: true
attributes:
  check_mode:
    support: full
    description: Says what would change, and writes nothing.
  diff_mode:
    support: full
    description: The changes of the environment and the unit as a unified diff (never the API key).
seealso:
  - module: ddtree.sglang.service_actions
  - module: ddtree.sglang.service_autotune_trial
"""

EXAMPLES = r"""
- name: Write each service's files
  ddtree.sglang.service_files:
    name: "{{ item.name }}"
    unit: "{{ item.unit }}"
    unit_file: "{{ lookup('ansible.builtin.template', 'sglang.service.j2', template_vars=unit_vars) }}"
    environment_file: "{{ lookup('ansible.builtin.template', 'sglang.env.j2', template_vars=unit_vars) }}"
    config_dir: /etc/sglang
    state_root: /var/lib/sglang
    owner: sglang
    group: sglang
  vars:
    unit_vars: {sglang_service_unit: "{{ item }}"}
  loop: "{{ sglang_service_plan.services }}"
  register: service_files
"""

RETURN = r"""
name:
  description: The service's name.
  returned: always
  type: str
  sample: coder
changes:
  description:
    - The files written or removed (or that would be, in check mode), of C(state_dir), C(environment), C(api_key)
      and C(unit).
  returned: always
  type: list
  elements: str
  sample: [environment, unit]
paths:
  description: Where the files are, by kind.
  returned: always
  type: dict
"""

import grp
import os
import pwd
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.service_files import (
    directory_differs,
    file_diff,
    file_differs,
    service_paths,
    wanted_files,
)

STATE_DIR_MODE = 0o750


def current_file(path: str) -> dict | None:
    """What is at `path`: {content, mode, uid, gid}, or None when nothing is."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    content = None
    if stat.S_ISREG(info.st_mode):
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            content = handle.read()
    return {"content": content, "mode": stat.S_IMODE(info.st_mode), "uid": info.st_uid, "gid": info.st_gid}


def write(path: str, content: str, mode: int) -> None:
    """Write a file whole (a reader never sees half of one), root's, with `mode`."""
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".%s." % os.path.basename(path))
    with os.fdopen(handle, "w", encoding="utf-8", errors="surrogateescape") as out:
        out.write(content)
    os.chmod(temporary, mode)
    os.chown(temporary, 0, 0)
    os.replace(temporary, path)


def make_directory(path: str, mode: int, uid: int, gid: int) -> None:
    """The directory and any missing parent, each created with `mode` and the owner (as ansible.builtin.file does)."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for directory in list(reversed(missing)) or [path]:
        if not os.path.isdir(directory):
            os.mkdir(directory)
        os.chmod(directory, mode)
        os.chown(directory, uid, gid)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            unit=dict(type="str", required=True),
            unit_file=dict(type="str", required=True),
            environment_file=dict(type="str", required=True, no_log=True),
            api_key=dict(type="str", no_log=True),
            config_dir=dict(type="path", required=True),
            state_root=dict(type="path", required=True),
            systemd_dir=dict(type="path", default="/etc/systemd/system"),
            owner=dict(type="str", required=True),
            group=dict(type="str", required=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    name = params["name"]
    paths = service_paths(name, params["unit"], params["config_dir"], params["state_root"], params["systemd_dir"])
    result = dict(changed=False, name=name, changes=[], paths=paths)
    try:
        uid, gid = pwd.getpwnam(params["owner"]).pw_uid, grp.getgrnam(params["group"]).gr_gid
    except KeyError as error:
        if not module.check_mode:
            module.fail_json(msg="%s: the services' account is missing: %s" % (name, error), **result)
        uid = gid = None  # check mode on a host the account is not created on yet: the directory would be created
    state_dir = current_file(paths["state_dir"])
    if uid is None or directory_differs(state_dir, STATE_DIR_MODE, uid, gid):
        result["changes"].append("state_dir")
    diffs = []
    writes = []
    for wanted in wanted_files(paths, params["unit_file"], params["environment_file"], params["api_key"]):
        current = current_file(wanted["path"])
        if not file_differs(wanted, current):
            continue
        result["changes"].append(wanted["kind"])
        writes.append(wanted)
        if wanted["kind"] != "api_key":
            diffs.append(file_diff(wanted["path"], (current or {}).get("content"), wanted["content"]))
    result["changed"] = bool(result["changes"])
    if module._diff and diffs:
        # A prepared diff, not before/after: the environment is a no_log option, which Ansible masks wherever
        # its whole text appears in the result, but not in the lines of a diff.
        result["diff"] = {"prepared": "".join(diffs)}
    if module.check_mode or not result["changed"]:
        module.exit_json(**result)
    try:
        if "state_dir" in result["changes"]:
            make_directory(paths["state_dir"], STATE_DIR_MODE, uid, gid)
        for wanted in writes:
            if wanted["content"] is None:
                os.unlink(wanted["path"])
            else:
                write(wanted["path"], wanted["content"], wanted["mode"])
    except OSError as error:
        module.fail_json(msg="%s: cannot write its files: %s" % (name, error), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
