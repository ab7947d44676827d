# shellcheck shell=bash
# Common settings for the project's scripts. Source it; it defines paths and helpers, and changes nothing.
#
# DDTREE_CACHE   where slow-to-build things live (venvs, wheelhouses, image build trees), shared by every
#                checkout on the machine so a fresh clone (as CI makes) reuses them.
# DDTREE_LAB_ID  prefix of the lab's container names; tests set a unique one per run.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DDTREE_CACHE="${DDTREE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddtree-sglang}"
export DDTREE_CACHE
export CONTAINERS_CONF="$REPO_ROOT/lab/containers.conf"
# One stable lab per checkout unless the caller names another.
DDTREE_LAB_ID="${DDTREE_LAB_ID:-ddtree-lab-$(printf '%s' "$REPO_ROOT" | sha256sum | cut -c1-8)}"
export DDTREE_LAB_ID

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

# Short content hash of files (for cache keys).
content_hash() { cat "$@" | sha256sum | cut -c1-12; }

# First python >= 3.12 found on PATH or under pyenv (ansible-core 2.21 needs it on the controller).
find_controller_python() {
  local candidate
  for candidate in "${DDTREE_CONTROLLER_PYTHON:-}" python3.13 python3.12 python3 \
      "$HOME"/.pyenv/versions/3.13*/bin/python3 "$HOME"/.pyenv/versions/3.12*/bin/python3; do
    [ -n "$candidate" ] || continue
    command -v "$candidate" >/dev/null 2>&1 || [ -x "$candidate" ] || continue
    if "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$candidate" 2>/dev/null || printf '%s\n' "$candidate"
      return 0
    fi
  done
  return 1
}

controller_venv() { printf '%s/controller-venv-%s\n' "$DDTREE_CACHE" "$(content_hash "$REPO_ROOT/requirements/controller.txt" "$REPO_ROOT/requirements/collections.txt" "$REPO_ROOT/scripts/bootstrap")"; }

# Mark a cached venv as used now, and remove the other "<prefix>-*" venvs unused for 14 days (venvs are
# keyed by requirement hashes, so every change of pins leaves an old one behind; a checkout that still
# needs one rebuilds it). Usage: prune_stale_venvs controller-venv "$venv"
prune_stale_venvs() {
  local prefix="$1" current="$2" other
  touch "$current/.last-used"
  for other in "$DDTREE_CACHE/$prefix"-*; do
    if [ ! -d "$other" ] || [ "$other" = "$current" ]; then continue; fi
    if [ -z "$(find "$other" -maxdepth 1 -name .last-used -mtime -14 2>/dev/null)" ] \
        && [ -z "$(find "$other" -maxdepth 0 -mtime -14 2>/dev/null)" ]; then
      log "removing $other (unused for 14 days)"
      rm -rf "$other"
    fi
  done
}

lab_image_tag() {
  local image="$REPO_ROOT/lab/image"
  printf 'localhost/ddtree-lab-host:%s\n' "$(content_hash "$image/packages.txt" "$image/build" "$image/ansiballz_bytecode_cache.py" \
    "$image/module_zygote.py" "$image/module_zygote_client.py" "$image/ddtree-lab-module-zygote.service")"
}

# The lab image with the lab's stack built in (lab/image/build-stacked): keyed by the plain image and
# every file that decides what playbooks/stacks.yml does on a lab host.
lab_stacked_image_tag() {
  local key
  key="$( { lab_image_tag
            cd "$REPO_ROOT" && python3 lab/image/stacked_inputs.py | tr '\n' '\0' | xargs -0 sha256sum; } \
          | sha256sum | cut -c1-12)"
  printf 'localhost/ddtree-lab-host-stacked:%s\n' "$key"
}

# Where the stacks of a lab image with stacks live (beside the image, not in it: lab/image/build-stacked
# says why), and whether that image and its stacks are both complete.
lab_stacks_dir() { printf '%s/lab-image/stacks-%s\n' "$DDTREE_CACHE" "${1##*:}"; }
lab_stacked_image_ready() {
  podman image exists "$1" 2>/dev/null && [ -f "$(lab_stacks_dir "$1")/complete" ]
}
