# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which release each service runs (docs/services.md, "Which release a service runs").

- A service whose algorithm loads the overlay (DDTREE) runs the rollout's candidate release, or the
  release its `release` field pins (by release id or source revision) and stays there.
- Every other service (NEXTN, EAGLE, DFLASH, NONE, ...) runs the host's base release: the stack and
  the release's extra wheels, nothing of the overlay. Its id does not depend on the overlay, so an
  overlay change neither restarts such a service nor changes what it runs.

Plain functions of plain data: the module reads the manifests, these decide.
"""

from __future__ import annotations

import re

# The algorithms that need the overlay: SGLang knows the others by itself.
OVERLAY_ALGORITHMS = ("DDTREE",)
# A service's `release` when it follows the rollout.
CANDIDATE = "candidate"
# A release id (12 hex digits) or a source revision (a Git commit, maybe with +dirty).
PIN = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._+-]{3,79}$")
# A pin by revision needs at least this many characters (a short Git hash).
MIN_REVISION_PREFIX = 7


def loads_overlay(algorithm):
    """Whether a service with this speculative algorithm runs an overlay release."""
    return algorithm in OVERLAY_ALGORITHMS


def release_pin_problems(label, service):
    """What is wrong with a service's `release` field, before anything on the host is read."""
    release = service.get("release") or CANDIDATE
    if release == CANDIDATE:
        return []
    algorithm = (service.get("speculative") or {}).get("algorithm", "NONE")
    if not loads_overlay(algorithm):
        return [
            "%s: release %r is pinned, but %s does not load the overlay (only %s services run overlay releases); "
            "remove release" % (label, release, algorithm, ", ".join(OVERLAY_ALGORITHMS))
        ]
    if not PIN.match(str(release)):
        return [
            "%s: release %r is neither %r nor a release id or source revision (4-80 letters, digits, '.', '_', '+', "
            "'-')" % (label, release, CANDIDATE)
        ]
    return []


def _revision_matches(pin, revision):
    """A pin names a revision when it is the revision, or a prefix of a clean one (a build of a tree
    with changes, `+dirty`, is never chosen by its commit's hash alone)."""
    if not revision:
        return False
    return pin == revision or (
        len(pin) >= MIN_REVISION_PREFIX and revision.startswith(pin) and "+dirty" not in revision
    )


def _describe(release_id, manifest):
    return "%s (revision %s, stack %s)" % (
        release_id,
        manifest.get("source_revision") or "unknown",
        manifest.get("stack_id") or "?",
    )


def resolve_pin(pin, releases, stack_id):
    """(release id, None) for the overlay release a pin names, or (None, why not).

    releases: {release id: manifest (without per-file hashes)} of the releases on the host. A release id
    wins over a revision; among releases of one revision (built for several stacks) the one for the
    host's active stack.
    """
    overlay = {rid: manifest for rid, manifest in releases.items() if manifest.get("overlay", True)}
    if pin in overlay:
        return pin, None
    if pin in releases:
        return None, "%s is a base release (no overlay)" % pin
    matches = sorted(
        rid for rid, manifest in overlay.items() if _revision_matches(pin, manifest.get("source_revision"))
    )
    if len(matches) > 1:
        on_stack = [rid for rid in matches if overlay[rid].get("stack_id") == stack_id]
        matches = on_stack if on_stack else matches
    if len(matches) == 1:
        return matches[0], None
    if matches:
        return None, "it matches %d releases: %s; pin one of them by its release id" % (
            len(matches),
            ", ".join(_describe(rid, overlay[rid]) for rid in matches),
        )
    there = ", ".join(_describe(rid, overlay[rid]) for rid in sorted(overlay)) or "none"
    return None, "no release on the host has that id or source revision (overlay releases there: %s)" % there


def choose_releases(services, candidate_id, base_id, releases, stack_id, host="host"):
    """(choices, problems): per service {release_id, follows, reason, overlay}, and every pin that fails.

    services: [{name, algorithm, release}] (the plan's entries); candidate_id: the release this run
    built from the overlay; base_id: the host's base release (None when no service needs one);
    releases: {release id: manifest} of the releases on the host.
    """
    choices, problems = {}, []
    for service in services:
        name, algorithm = service["name"], service.get("algorithm", "NONE")
        pin = service.get("release") or CANDIDATE
        if not loads_overlay(algorithm):
            choices[name] = {
                "release_id": base_id,
                "follows": "base",
                "overlay": False,
                "reason": "%s does not load the overlay: the base release (the stack alone)" % algorithm,
            }
        elif pin == CANDIDATE:
            choices[name] = {
                "release_id": candidate_id,
                "follows": "candidate",
                "overlay": True,
                "reason": "follows the rollout's candidate",
            }
        else:
            release_id, why = resolve_pin(pin, releases, stack_id)
            if why:
                problems.append(
                    "%s: service %s pins release %r: %s. Pin a release that is on the host, roll out that "
                    "revision first (it builds the release), or set release: %s" % (host, name, pin, why, CANDIDATE)
                )
                continue
            manifest = releases[release_id]
            choices[name] = {
                "release_id": release_id,
                "follows": "pin",
                "overlay": True,
                "reason": "pinned by release: %s (revision %s)" % (pin, manifest.get("source_revision") or "unknown"),
            }
    return choices, problems
