"""The lab's speed-ups must change nothing a module or task sees: the kept bytecode of a module payload is
what compiling its source gives, and the preloaded plugin docs are the ones a worker would parse."""

import importlib.util
import multiprocessing
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


def parses_in_a_fork(loader_name, name):
    """How many plugin docs a forked child (as a task's worker is) parses to load the plugin."""
    from ansible.plugins import loader

    def child(queue):
        parsed = []
        original = loader.yaml.load
        loader.yaml.load = lambda *args, **kwargs: parsed.append(1) or original(*args, **kwargs)
        getattr(loader, loader_name).get(name, class_only=True)
        queue.put(len(parsed))

    queue = multiprocessing.get_context("fork").SimpleQueue()
    process = multiprocessing.get_context("fork").Process(target=child, args=(queue,))
    process.start()
    process.join(60)
    return queue.get()


def test_a_worker_forked_after_the_preload_parses_no_plugin_docs_for_the_lab_connection():
    from ansible.plugins.loader import connection_loader, init_plugin_loader

    init_plugin_loader()
    preload = load("plugin_docs_preload", "lab/callback_plugins/plugin_docs_preload.py")
    connection = lab_connection()
    assert connection in dict(preload.PRELOADED)[connection_loader]
    preload.CallbackModule()
    assert parses_in_a_fork("connection_loader", connection) == 0
    assert parses_in_a_fork("lookup_loader", "ansible.builtin.env") == 0
    # Not preloaded: a worker parses it (the check above can see a parse).
    assert parses_in_a_fork("lookup_loader", "ansible.builtin.url") > 0
