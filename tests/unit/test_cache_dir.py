"""The controller's cache folder has one rule: plugin_utils/cache.py for Python and Ansible (through the
lookup ddtree.sglang.cache_dir), scripts/lib.sh for the shell scripts; the two agree, and nothing else
spells it."""

import os
import subprocess

import pytest
from conftest import REPO_ROOT

from ansible_collections.ddtree.sglang.plugins.plugin_utils.cache import cache_dir

CASES = [
    ({"HOME": "/home/ci"}, "/home/ci/.cache/ddtree-sglang"),
    ({"HOME": "/home/ci", "XDG_CACHE_HOME": "/var/cache/ci"}, "/var/cache/ci/ddtree-sglang"),
    ({"HOME": "/home/ci", "XDG_CACHE_HOME": "/var/cache/ci", "DDTREE_CACHE": "/srv/ddtree"}, "/srv/ddtree"),
]
# Files that may name the rule's parts: the two statements of it, and documentation of it (the lookup's
# and rollout_lock's docs, and sample paths in RETURN).
ALLOWED = {
    "scripts/lib.sh",
    "plugins/plugin_utils/cache.py",
    "plugins/lookup/cache_dir.py",
    "plugins/modules/rollout_lock.py",
    "plugins/modules/overlay_build.py",
    "plugins/modules/wheelhouse.py",
    "tests/unit/test_cache_dir.py",
}


@pytest.mark.parametrize("environ, expected", CASES)
def test_the_rule(environ, expected):
    assert cache_dir(environ=environ) == expected
    assert cache_dir("overlay", environ=environ) == os.path.join(expected, "overlay")


@pytest.mark.parametrize("environ, expected", CASES)
def test_the_shell_scripts_follow_the_same_rule(environ, expected):
    env = dict(environ, PATH=os.environ["PATH"])
    out = subprocess.run(
        ["bash", "-c", 'source scripts/lib.sh && printf "%s" "$DDTREE_CACHE"'],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == expected == cache_dir(environ=environ)


def test_nothing_else_spells_the_rule():
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    spelled = []
    for name in files:
        path = REPO_ROOT / name
        # Prose (docs, changelog fragments) may describe the rule.
        if (
            name in ALLOWED
            or name.endswith(".md")
            or name.startswith("changelogs/")
            or not path.is_file()
            or path.is_symlink()
        ):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if ".cache/ddtree-sglang" in text or "XDG_CACHE_HOME" in text and "ddtree-sglang" in text:
            spelled.append(name)
    assert spelled == []
