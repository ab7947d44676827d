#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: rollout_lock
short_description: Hold one rollout lock per host for the rest of the playbook run
version_added: 0.1.0
description:
  - Takes a lock on the controller for every host in I(hosts) and keeps it until the
    C(ansible-playbook) process that ran the task ends, however it ends. A second rollout for any
    of the same hosts waits for it (up to I(timeout)) or is refused; it never runs over a rollout in
    progress. Rollouts for other hosts go on in parallel.
  - The locks are C(flock) locks on files in I(dir), held by a small process that watches the
    playbook's process; the kernel releases them when it exits, so a killed run leaves no stale lock.
  - Every trigger of a fleet (CI job, the pull timer, a person) must use the same I(dir) on the same
    machine - run them on one rollout node as one user, or point C(DDTREE_LOCK_DIR) at a directory
    they share.
  - Hosts are keyed by C(ansible_host) (or their inventory name when it is not set).
  - An action plugin. It runs on the controller and connects to no host; run it once per play
    (C(run_once)).
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  hosts:
    description: Inventory names of the hosts the rollout targets (usually C(ansible_play_hosts_all)).
    type: list
    elements: str
    required: true
  dir:
    description:
      - Directory of the lock files.
      - Defaults to C(DDTREE_LOCK_DIR), else C(locks) in the controller's cache folder (C($DDTREE_CACHE), else
        C($XDG_CACHE_HOME/ddtree-sglang), else C(~/.cache/ddtree-sglang)).
    type: path
  timeout:
    description: Seconds to wait for another rollout to finish; C(0) refuses at once.
    type: float
    default: 3600
attributes:
  check_mode:
    support: full
    description: A plan takes the lock too, so it never reads a host halfway through a rollout.
  diff_mode:
    support: none
    description: Takes a lock; there is nothing to diff.
  action:
    support: full
    description: Runs on the controller; connects to no host.
  async:
    support: none
    description: Holds the lock for the whole run, never in the background of one task.
  platform:
    support: full
    platforms: posix
    description: The controller must have flock(2) (Linux, BSD, macOS).
notes:
  - The lock lives on the controller. Two controllers that do not share I(dir) do not see each
    other's locks.
  - How triggers, locks and reports fit together is in C(docs/gitops.md) of the collection.
"""

EXAMPLES = r"""
- name: Take the rollout lock for every targeted host
  ddtree.sglang.rollout_lock:
    hosts: "{{ ansible_play_hosts_all }}"
    timeout: 600
  run_once: true

- name: Refuse at once if another rollout is running
  ddtree.sglang.rollout_lock:
    hosts: "{{ ansible_play_hosts_all }}"
    timeout: 0
  run_once: true
"""

RETURN = r"""
locked:
  description: The hosts locked for this run.
  returned: success
  type: list
  elements: str
  sample: [ct129, ct200]
waited_s:
  description: Seconds spent waiting for another rollout.
  returned: always
  type: float
  sample: 0.1
lock_dir:
  description: Where the lock files are.
  returned: always
  type: str
owner:
  description: What this run wrote into the lock files (pid, controller, user, trigger, revision, hosts).
  returned: always
  type: dict
refused:
  description: True when another rollout still held a lock at the deadline.
  returned: when refused
  type: bool
holder:
  description: The owner record of the rollout that holds the lock.
  returned: when refused
  type: dict
"""
