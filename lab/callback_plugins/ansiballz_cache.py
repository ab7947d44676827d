"""Module payloads built once per content, not once per ansible-playbook run (lab and tests only).

ansible-core builds each module's AnsiballZ payload (the module and every module_utils it imports, found by
compiling their source to an AST) the first time a run uses the module, into `ansiballz_cache` under the
run's own local temporary folder, and removes it when the run ends. A converge of the lab uses some 25
modules: about 6 of its 38 controller CPU-seconds go into those payloads, and the test suite starts some
20 such runs. This callback points a run's `ansiballz_cache` at a folder under DDTREE_ANSIBALLZ_CACHE
keyed by everything a payload is built from (ansible-core and its Python, the collection folders' plugin
files, byte for byte), so a later run with the same content finds them built. A changed module or
module_utils changes the key: a stale payload is never used. Without DDTREE_ANSIBALLZ_CACHE, or when the
folder cannot be made, it does nothing. Loaded by scripts/test for the lab stages, like task_times;
nothing of it ships with the collection.
"""

from __future__ import annotations

DOCUMENTATION = """
name: ansiballz_cache
type: aggregate
short_description: Keep built module payloads between runs, keyed by their sources (lab and tests only)
description:
  - Links the run's AnsiballZ payload cache to a folder under C(DDTREE_ANSIBALLZ_CACHE), keyed by content.
options: {}
"""

import hashlib
import os
import sys

import ansible
from ansible import constants as C
from ansible.plugins.callback import CallbackBase
from ansible.release import __version__ as ansible_version

# What ansible-core calls the folder under its local temporary folder (executor/module_common.py).
PAYLOAD_FOLDER = "ansiballz_cache"


def collection_dirs(roots):
    for root in roots:
        for namespace in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            if os.path.isdir(os.path.join(root, namespace)):
                for name in sorted(os.listdir(os.path.join(root, namespace))):
                    yield os.path.join(root, namespace, name)


def content_key(collection_roots):
    """A hash of everything a payload is built from: ansible-core (its version and where it is), this Python,
    and each collection's files: an installed collection's MANIFEST.json (which holds every file's checksum),
    or, for a checkout without one, every file under plugins/ (path and bytes)."""
    digest = hashlib.sha256()
    for part in (ansible_version, os.path.dirname(ansible.__file__), sys.version):
        digest.update(part.encode() + b"\0")
    for collection in collection_dirs(collection_roots):
        manifest = os.path.join(collection, "MANIFEST.json")
        paths = [manifest] if os.path.isfile(manifest) else []
        if not paths:
            for folder, dirs, files in os.walk(os.path.realpath(os.path.join(collection, "plugins"))):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                paths += [os.path.join(folder, name) for name in sorted(files) if not name.endswith(".pyc")]
        for path in paths:
            digest.update(path.encode() + b"\0")
            with open(path, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())
    return digest.hexdigest()[:16]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ansiballz_cache"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self):
        super().__init__()
        base = os.environ.get("DDTREE_ANSIBALLZ_CACHE")
        if not base:
            return
        try:
            roots = [os.path.join(path, "ansible_collections") for path in C.COLLECTIONS_PATHS]
            roots += [
                os.path.join(path, "ansible_collections")
                for path in sys.path
                if os.path.isdir(os.path.join(path, "ansible_collections"))
            ]
            shared = os.path.join(base, content_key(roots))
            os.makedirs(shared, exist_ok=True)
            os.utime(shared)  # the folder's time is its last use (scripts/test prunes unused ones)
            link = os.path.join(C.DEFAULT_LOCAL_TMP, PAYLOAD_FOLDER)
            if not os.path.lexists(link):
                os.symlink(shared, link)
        except OSError:
            return
