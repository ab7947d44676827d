#!/usr/bin/env bash
# The working tree a device call sends is capped (64 MiB with the carry), and the evidence's large files (the
# trained model archives, the raw results) count towards it though most calls never read them.
#   tests/gpu_sglang/stage-call.sh away [KEEP...]   move them under .cache/call-stash/ (KEEP: paths that stay,
#                                                    e.g. docs/evidence/gpu-sglang/models.tgz for `traffic`)
#   tests/gpu_sglang/stage-call.sh back             put them back (run it before committing)
#   tests/gpu_sglang/stage-call.sh size             what a call would send: the tree and .cache/gpu-sglang
# "Large": over STAGE_MIN_KB (default 100) kB, under docs/evidence/.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
stash=$repo/.cache/call-stash
cd "$repo"
case ${1:-} in
  away)
    shift
    mkdir -p "$stash"
    git ls-files -z docs/evidence | while IFS= read -r -d '' path; do
      [ -f "$path" ] || continue
      for keep in "$@"; do [ "$path" = "$keep" ] && continue 2; done
      [ "$(stat -c %s "$path")" -gt $(( ${STAGE_MIN_KB:-100} * 1024 )) ] || continue
      mkdir -p "$stash/$(dirname "$path")" && mv "$path" "$stash/$path"
    done
    "$0" size ;;
  back)
    [ -d "$stash" ] || { echo "nothing staged"; exit 0; }
    (cd "$stash" && find . -type f -print0) | while IFS= read -r -d '' path; do
      mkdir -p "$(dirname "$path")" && mv "$stash/$path" "$path"
    done
    rm -rf "$stash"
    git status --short docs/evidence | head ;;
  size)
    # tracked files still present (a staged one is not) and untracked ones git does not ignore
    tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) \
      | python3 -c 'import os, sys; print(sum(os.path.getsize(p) for p in sys.stdin.read().split("\0") if os.path.isfile(p)))')
    carry=$(du -sb .cache/gpu-sglang 2>/dev/null | cut -f1 || echo 0)
    echo "tree $(( tree / 1048576 )) MiB + .cache/gpu-sglang $(( ${carry:-0} / 1048576 )) MiB = $(( (tree + ${carry:-0}) / 1048576 )) MiB of 64" ;;
  *) sed -n '2,8p' "$0"; exit 2 ;;
esac
