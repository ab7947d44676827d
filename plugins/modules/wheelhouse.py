#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: wheelhouse
short_description: Download exactly the wheels of a pin set's lock, for shipping to air-gapped hosts
version_added: 0.1.0
description:
  - Runs C(pip download --require-hashes --no-deps --only-binary=:all:) for a lock file, for the target
    hosts' Python version and glibc (not the machine it runs on), into a directory.
  - A marker named after the lock's sha256 is written last, so an unchanged lock is a no-op that does not
    contact any index, and an interrupted download is completed on the next run.
  - Also writes C(<dest>.tar), the wheels in one uncompressed archive (wheels are compressed already),
    so shipping them to a host is one transfer instead of one per file.
  - Usually run on the controller (C(delegate_to=localhost), C(run_once=true)); the hosts then install
    from a copy of the directory with C(--no-index).
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  lock:
    description: The lock file (every requirement pinned with C(==) and C(--hash)).
    type: path
    required: true
  dest:
    description: Directory for the wheels. Created if missing.
    type: path
    required: true
  python_version:
    description: Target Python as C(major.minor), for example C(3.11).
    type: str
    required: true
  glibc:
    description: Lowest glibc of the target hosts, for example C(2.36); selects the manylinux wheels.
    type: str
    required: true
  index_url:
    description: Base index URL for pip; pip's own configuration when omitted.
    type: str
  extra_index_urls:
    description: Extra index URLs (for example a PyTorch wheel index).
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
    description: Reports whether a download would happen, and downloads nothing.
  diff_mode:
    support: none
    description: Wheels are binary; the result lists the files instead.
"""

EXAMPLES = r"""
- name: Prepare the lab-cpu wheelhouse on the controller
  ddtree.sglang.wheelhouse:
    lock: roles/sglang_stack/files/pinsets/lab-cpu/requirements-py311.lock
    dest: "{{ lookup('ddtree.sglang.cache_dir', 'wheelhouse/lab-cpu-py311') }}"
    python_version: "3.11"
    glibc: "2.36"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
files:
  description: The wheel files in I(dest) after the run.
  returned: always
  type: list
  elements: str
  sample: [torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl]
archive:
  description: The wheels in one tar archive, for shipping.
  returned: always
  type: str
  sample: /root/.cache/ddtree-sglang/wheelhouse/77302530b653.tar
marker:
  description: The marker that records a complete download of this lock.
  returned: always
  type: str
  sample: /root/.cache/ddtree-sglang/wheelhouse/lab-cpu-py311/.complete-5f1c9e2a0b7d
"""

import hashlib
import os
import sys
import tarfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.host_lock import exclusive
from ansible_collections.ddtree.sglang.plugins.module_utils.pinset import download_command


def main():
    module = AnsibleModule(
        argument_spec=dict(
            lock=dict(type="path", required=True),
            dest=dict(type="path", required=True),
            python_version=dict(type="str", required=True),
            glibc=dict(type="str", required=True),
            index_url=dict(type="str"),
            extra_index_urls=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        with open(params["lock"], "rb") as handle:
            lock_sha = hashlib.sha256(handle.read()).hexdigest()[:12]
    except OSError as error:
        module.fail_json(msg="cannot read the lock %s: %s" % (params["lock"], error))
    marker = os.path.join(params["dest"], ".complete-%s" % lock_sha)
    # Hosts of one run download the same lock at once (one task per host): one downloads, the others
    # wait here and then find it complete.
    parent = os.path.dirname(params["dest"].rstrip(os.sep)) or "."
    if module.check_mode:
        report(module, params, marker)
    os.makedirs(parent, exist_ok=True)
    with exclusive(params["dest"].rstrip(os.sep) + ".lock"):  # released on exit too, however it exits
        download(module, params, marker)


def report(module, params, marker):
    """Check mode: say whether a download would happen."""
    archive = params["dest"].rstrip(os.sep) + ".tar"
    module.exit_json(
        changed=not (os.path.exists(marker) and os.path.exists(archive)),
        files=wheels(params["dest"]),
        marker=marker,
        archive=archive,
    )


def wheels(dest):
    if not os.path.isdir(dest):
        return []
    return sorted(name for name in os.listdir(dest) if name.endswith(".whl"))


def download(module, params, marker):
    """Download the lock's wheels unless a complete download is there; archive them; mark it complete."""
    dest = params["dest"]
    archive = dest.rstrip(os.sep) + ".tar"

    def write_archive():
        with tarfile.open(archive + ".tmp", "w") as tar:
            for name in wheels(dest):
                tar.add(os.path.join(dest, name), arcname=name)
        os.replace(archive + ".tmp", archive)

    if os.path.exists(marker):
        changed = not os.path.exists(archive)
        if changed:
            write_archive()
        module.exit_json(changed=changed, files=wheels(dest), marker=marker, archive=archive)
    try:
        command = download_command(
            sys.executable,
            params["lock"],
            dest,
            params["python_version"],
            params["glibc"],
            params["index_url"],
            params["extra_index_urls"],
        )
    except ValueError as error:
        module.fail_json(msg="glibc: %s" % error)
    os.makedirs(dest, exist_ok=True)
    rc, stdout, stderr = module.run_command(command)
    if rc != 0:
        module.fail_json(
            msg="pip download of %s failed (exit %d): %s" % (params["lock"], rc, stderr.strip()[-1500:]),
            cmd=command,
            rc=rc,
            stdout=stdout,
            stderr=stderr,
        )
    for name in os.listdir(dest):
        if name.startswith(".complete-"):
            os.remove(os.path.join(dest, name))
    write_archive()
    with open(marker, "w") as handle:
        handle.write(params["lock"] + "\n")
    module.exit_json(changed=True, files=wheels(dest), marker=marker, archive=archive, cmd=command)


if __name__ == "__main__":
    main()
