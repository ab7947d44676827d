"""Lab hosts only: keep the bytecode of modules Python imports from zip archives.

Every Ansible module runs as an AnsiballZ payload: a zip of the module and the ansible-core module_utils
it needs, imported with zipimport, which never writes bytecode. So each module run compiles
ansible.module_utils.basic and some 50 files it imports from source: about 0.15 of the 0.36 CPU-seconds
a module run costs on a lab host (docs/testing.md). The lab runs some 3,000 module runs per test suite on
two shared cores; production hosts run fewer and have cores to spare, and never get this file.

Loaded by a .pth file in the system Python's dist-packages (lab/image/build), so it applies to
/usr/bin/python3 alone: venvs (the stacks) do not read that directory. Bytecode is keyed by the source's
hash and the interpreter's cache tag, so it is exactly what compiling the same source gives; only the
file name inside it (the payload's temporary path, deleted when the module ends) is the first run's.
A cache that cannot be read or written is ignored: the module compiles as it would without this file.
"""

import hashlib
import marshal
import os
import sys
import zipimport

CACHE_DIR = os.path.join("/var/cache/ddtree-lab/zipimport-bytecode", sys.implementation.cache_tag)

_compile_source = zipimport._compile_source
# zipimport compiles each module twice per import (find_spec asks for its file name through the code): the
# second time is answered from here.
_last_compiled = {}


def _compile_source_cached(pathname, source):
    last = _last_compiled.get(pathname)
    if last is not None and last[0] == source:
        return last[1]
    code = _load_or_compile(pathname, source)
    _last_compiled[pathname] = (source, code)
    return code


def _load_or_compile(pathname, source):
    path = os.path.join(CACHE_DIR, hashlib.sha256(source).hexdigest())
    try:
        with open(path, "rb") as cached:
            return marshal.loads(cached.read())  # one read: marshal.load(file) reads piece by piece
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code = _compile_source(pathname, source)
    try:
        os.makedirs(CACHE_DIR, exist_ok=True)
        partial = "%s.%d.tmp" % (path, os.getpid())
        with open(partial, "wb") as out:
            marshal.dump(code, out)
        os.replace(partial, path)  # readers see a whole file or none
    except OSError:
        pass
    return code


# zipimport looks this function up each time it compiles, so replacing it is enough (CPython 3.8+).
if hasattr(zipimport, "_compile_source"):
    zipimport._compile_source = _compile_source_cached
