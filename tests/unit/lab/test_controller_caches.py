"""The lab's speed-ups must change nothing a module or task sees: the kept bytecode of a module payload is
what compiling its source gives, and the preloaded plugin docs are the ones a worker would parse."""

import importlib.util
import json
import subprocess
import sys
import zipimport
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bytecode_cache(tmp_path, monkeypatch):
    original = zipimport._compile_source
    try:
        module = load("ddtree_lab_ansiballz_bytecode_cache", "lab/image/ansiballz_bytecode_cache.py")
    finally:
        zipimport._compile_source = original  # importing it installs the hook: not in this process
    monkeypatch.setattr(module, "CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(module, "_compile_source", original)
    module._last_compiled.clear()
    return module


def run(code):
    namespace = {}
    exec(code, namespace)  # noqa: S102 - the test's own source
    return namespace["answer"]


def test_kept_bytecode_is_what_compiling_gives_and_a_changed_source_compiles_again(bytecode_cache, tmp_path):
    first = bytecode_cache._compile_source_cached("/tmp/payload-1/mod.py", b"answer = 41 + 1\n")
    assert run(first) == 42
    assert len(list((tmp_path / "cache").iterdir())) == 1
    # Another payload (another temporary path), same source: read from the cache, not compiled.
    bytecode_cache._last_compiled.clear()
    bytecode_cache._compile_source = lambda *_: pytest.fail("compiled although the bytecode was kept")
    again = bytecode_cache._compile_source_cached("/tmp/payload-2/mod.py", b"answer = 41 + 1\n")
    assert run(again) == 42 and again.co_code == first.co_code
    # A changed source is never answered with the old bytecode.
    bytecode_cache._compile_source = lambda pathname, source: compile(source, pathname, "exec", dont_inherit=True)
    changed = bytecode_cache._compile_source_cached("/tmp/payload-2/mod.py", b"answer = 6 * 7 + 1\n")
    assert run(changed) == 43
    assert len(list((tmp_path / "cache").iterdir())) == 2


def test_a_broken_cache_file_compiles_from_source(bytecode_cache, tmp_path):
    source = b"answer = 'from source'\n"
    bytecode_cache._compile_source_cached("/tmp/p/mod.py", source)
    (entry,) = (tmp_path / "cache").iterdir()
    entry.write_bytes(b"\x00not marshal data")
    bytecode_cache._last_compiled.clear()
    assert run(bytecode_cache._compile_source_cached("/tmp/p/mod.py", source)) == "from source"


def lab_connection():
    return yaml.safe_load((REPO / "inventories/lab/group_vars/lab.yml").read_text())["ansible_connection"]


# Run in a process of its own: initializing ansible-core's plugin loader in pytest's process would replace
# the collection loader the other unit tests rely on.
FORKED_PARSES = """
import json, multiprocessing, sys
from ansible.plugins import loader
loader.init_plugin_loader()
preload_path, plugins = sys.argv[1], json.loads(sys.argv[2])

def parses_in_a_fork(loader_name, name):
    # How many plugin docs a forked child (as a task's worker is forked) parses to load the plugin.
    def child(queue):
        parsed = []
        original = loader.yaml.load
        loader.yaml.load = lambda *args, **kwargs: parsed.append(1) or original(*args, **kwargs)
        getattr(loader, loader_name).get(name, class_only=True)
        queue.put(len(parsed))
    context = multiprocessing.get_context("fork")
    queue = context.SimpleQueue()
    process = context.Process(target=child, args=(queue,))
    process.start()
    process.join(60)
    return queue.get()

import importlib.util
spec = importlib.util.spec_from_file_location("plugin_docs_preload", preload_path)
preload = importlib.util.module_from_spec(spec)
spec.loader.exec_module(preload)
preload.CallbackModule()
print(json.dumps({"preloaded": [name for _, names in preload.PRELOADED for name in names],
                  "parses": [parses_in_a_fork(loader_name, name) for loader_name, name in plugins]}))
"""


def test_a_worker_forked_after_the_preload_parses_no_plugin_docs_for_the_lab_connection():
    connection = lab_connection()
    plugins = [
        ["connection_loader", connection],
        ["lookup_loader", "ansible.builtin.env"],
        # Not preloaded: a worker parses it (the check can see a parse).
        ["lookup_loader", "ansible.builtin.url"],
    ]
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            FORKED_PARSES,
            str(REPO / "lab/callback_plugins/plugin_docs_preload.py"),
            json.dumps(plugins),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    answer = json.loads(out)
    assert connection in answer["preloaded"]
    connection_parses, env_parses, url_parses = answer["parses"]
    assert connection_parses == 0 and env_parses == 0
    assert url_parses > 0
