#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_facts
short_description: Gather the non-GPU host facts an SGLang service needs
version_added: 0.1.0
description:
  - Finds which FFmpeg releases are complete on the host as torchcodec needs them (all seven
    libraries of one release, as the dynamic loader sees them with C(ldconfig -p)).
  - Measures free disk space for the given paths; a path that does not exist yet is measured on
    its closest existing parent.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  disk_paths:
    description:
      - Paths whose file systems' free space is measured.
    type: list
    elements: path
    default: [/opt]
extends_documentation_fragment:
  - ddtree.sglang.attributes.read_only
  - ddtree.sglang.attributes.facts
seealso:
  - module: ddtree.sglang.gpu_facts
"""

EXAMPLES = r"""
- name: Gather host facts for the SGLang root
  ddtree.sglang.host_facts:
    disk_paths:
      - /opt/sglang

- name: Require FFmpeg for torchcodec
  ansible.builtin.assert:
    that: ansible_facts.ddtree_host.ffmpeg.complete | length > 0
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: success
  type: dict
  contains:
    ddtree_host:
      description: Host facts.
      type: dict
      contains:
        ffmpeg:
          description:
            - C(sonames) maps each FFmpeg library to the major versions the loader finds;
              C(complete) lists the FFmpeg releases with all seven libraries; C(missing) lists, per
              incomplete release, the sonames it lacks; C(closest) is the incomplete release that
              lacks the fewest (null when a release is complete or none is present).
          type: dict
          sample:
            sonames: {libavcodec: [59], libavdevice: [59], libavfilter: [8], libavformat: [59],
                      libavutil: [57], libswresample: [4], libswscale: [6]}
            complete: ["5"]
            missing: {"4": [libavutil.so.56]}
            closest: null
        disk:
          description: Free and total MiB per requested path.
          type: list
          elements: dict
          sample:
            - path: /opt/sglang
              checked_path: /opt
              free_mib: 51200
              total_mib: 257000
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.host_checks import (
    disk_space,
    ffmpeg_releases,
    ffmpeg_sonames,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(disk_paths=dict(type="list", elements="path", default=["/opt"])),
        supports_check_mode=True,
    )
    ldconfig = module.get_bin_path("ldconfig", required=True, opt_dirs=["/sbin", "/usr/sbin"])
    rc, stdout, stderr = module.run_command([ldconfig, "-p"])
    if rc != 0:
        module.fail_json(msg="%s -p exited with %d: %s" % (ldconfig, rc, stderr.strip()), rc=rc, stderr=stderr)
    sonames = ffmpeg_sonames(stdout)
    ffmpeg = dict(sonames=sonames, **ffmpeg_releases(sonames))
    disk = [disk_space(path) for path in module.params["disk_paths"]]
    module.exit_json(changed=False, ansible_facts={"ddtree_host": {"ffmpeg": ffmpeg, "disk": disk}})


if __name__ == "__main__":
    main()
