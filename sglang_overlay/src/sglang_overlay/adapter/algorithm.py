"""The DDTREE speculative algorithm object: a DFlash-family ``CustomSpecAlgo``.

SGLang 0.5.23 dispatches on ``SpeculativeAlgorithm`` enum members and plugin ``CustomSpecAlgo``
instances through the same duck-typed methods (``is_*``, ``supports_*``, ``has_draft_kv``,
``carries_draft_hidden_states``, ``need_topk``, ``create_future_map``, ...). A plain
``CustomSpecAlgo`` answers False to every ``is_*`` and lacks several of the others: the target's
hidden states would not be captured and the scheduler would raise ``AttributeError``. DDTREE is
DFlash with a different verify, so this class answers every such method exactly as
``SpeculativeAlgorithm.DFLASH`` does. The methods are found by introspecting the enum
(not listed by hand), so a method SGLang adds is delegated too.

Only two methods differ from DFLASH's:

* ``create_worker`` returns the DDTree worker;
* ``handle_server_args`` is never reached in a normal start: the adapter's resolution hook turns
  ``DDTREE`` into ``DFLASH`` + DDTree settings before any resolution step runs (see
  ``resolution.py``), so SGLang's own DFLASH setup (``_handle_dflash``) and every place that
  compares the algorithm string with "DFLASH" apply unchanged.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from .settings import ALGORITHM_NAME

# Enum methods DDTREE does not take from DFLASH (classmethods are skipped anyway).
_OWN_METHODS = frozenset({"create_worker", "handle_server_args"})


def delegated_method_names() -> list[str]:
    """Instance methods of ``SpeculativeAlgorithm`` that DDTREE answers as DFLASH does."""
    names = []
    for name, value in vars(SpeculativeAlgorithm).items():
        if name.startswith("_") or name in _OWN_METHODS:
            continue
        if inspect.isfunction(value):  # classmethods/staticmethods/members are not functions
            names.append(name)
    return sorted(names)


def _delegate(name: str) -> Callable[..., Any]:
    def method(self, *args, **kwargs):
        return getattr(SpeculativeAlgorithm.DFLASH, name)(*args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"DDTreeSpecAlgo.{name}"
    method.__doc__ = f"Same as SpeculativeAlgorithm.DFLASH.{name} (DDTREE is DFlash-family)."
    return method


def _create_worker(self, server_args):
    """The DDTree worker (via the factory given at registration, as for any plugin algorithm)."""
    return CustomSpecAlgo.create_worker(self, server_args)


def _handle_server_args(self, server_args) -> None:
    raise RuntimeError(
        "DDTREE reached SpeculativeAlgorithm.handle_server_args: the ddtree plugin's resolution "
        "hook (which turns DDTREE into DFLASH + DDTree settings before resolution) did not run. "
        "Start SGLang through its launcher after load_plugins(), or call "
        "sglang_overlay.adapter.resolution.canonicalize_ddtree(server_args) first."
    )


def _build_class() -> type:
    namespace: Dict[str, Any] = {name: _delegate(name) for name in delegated_method_names()}
    namespace["create_worker"] = _create_worker
    namespace["handle_server_args"] = _handle_server_args
    namespace["__doc__"] = __doc__
    namespace["__repr__"] = lambda self: f"DDTreeSpecAlgo({self.name!r})"
    return type("DDTreeSpecAlgo", (CustomSpecAlgo,), namespace)


DDTreeSpecAlgo = _build_class()


def _worker_factory(server_args):
    from .worker import DDTreeWorker  # GPU-side imports only where a worker is made

    return DDTreeWorker


def around_create_worker(original, self, server_args, *args, **kwargs):
    """DFLASH + DDTree settings on the record -> the DDTree worker; anything else unchanged."""
    from .resolution import resolved_settings

    if self is SpeculativeAlgorithm.DFLASH and resolved_settings(server_args) is not None:
        return _worker_factory(server_args)
    return original(self, server_args, *args, **kwargs)


def register_worker_selection() -> None:
    """Hook ``SpeculativeAlgorithm.create_worker`` (AROUND) with ``around_create_worker``, in every process."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .hooks import TARGET_CREATE_WORKER

    HookRegistry.register(TARGET_CREATE_WORKER, around_create_worker, HookType.AROUND)


def register_ddtree_algorithm() -> bool:
    """Register DDTREE with SGLang's registry. Returns False when it was already registered."""
    from sglang.srt.speculative.spec_registry import get_spec

    if get_spec(ALGORITHM_NAME) is not None:
        return False
    SpeculativeAlgorithm.register(ALGORITHM_NAME, supports_overlap=True, spec_class=DDTreeSpecAlgo)(_worker_factory)
    return True
