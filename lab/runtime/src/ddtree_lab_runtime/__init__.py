"""The lab runtime: a stand-in for ``python -m sglang.launch_server`` on the lab's GPU-less hosts.

LAB-ONLY CODE, a package of its own beside the overlay: only the lab's releases carry it (the lab's
inventory has the sglang_service role install its wheel into each release), and a production unit
never starts it (production units run ``sglang.launch_server``). The lab's units run::

    python -m ddtree_lab_runtime <the same flags as python -m sglang.launch_server>

inside the lab stack (the real SGLang 0.5.23 on CPU torch, no transformers, no torchvision) with
the release's site dir on PYTHONPATH. It behaves like SGLang where the deploy tooling can see it:

* startup: ``load_plugins()``, then SGLang's own ``prepare_server_args`` (bad flags exit 2), then
  the speculative algorithm through ``SpeculativeAlgorithm.from_string`` and the resolution hooks
  plugins registered (the DDTree adapter's included);
* journal markers: "Load weight begin/end", "Uvicorn running on http://HOST:PORT", "The server is
  fired up and ready to roll!", and on fatal errors "Scheduler hit an exception" + traceback +
  "Received sigquit from a child process" followed by a SIGKILL of itself (``status=9/KILL``);
* SGLang's HTTP surface (health that generates, ``/v1/models`` answered from memory, OpenAI and
  native generation, ``/server_info`` with ``avg_spec_accept_length``, Prometheus ``/metrics``);
* a small deterministic CPU model (``model.LabLM``) and real speculative decoding with the
  overlay's core (DDTREE trees, DFLASH and EAGLE chains), lossless at temperature 0;
* the DDTree incident (a DFlash-draft algorithm that is not DFlash-family: no hidden-state
  capture, output ``!!!!!!!!``) and fault switches from the environment (``faults``).

See lab/runtime/README.md for the contract (flags, environment, endpoints, what is not modelled).
"""

__all__: list[str] = []
