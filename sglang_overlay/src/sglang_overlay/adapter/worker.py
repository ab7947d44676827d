"""The DDTree worker: SGLang 0.5.23's DFlash worker, drafting a tree instead of a chain.

Importing this module needs SGLang's GPU stack (it subclasses ``DFlashWorkerV2``), so the CPU test
suite does not import it. On a CPU the suite tests what runs without that stack: the step's control
flow (``tree_step.run_tree_step``) with toy models, the tensor glue (``tree_verify``) against SGLang's
own Triton verify kernel, the worker selection hook, the CUDA-graph guard, and, from the installed
sources, that every SGLang name and keyword this module uses exists (``tests/adapter/
test_worker_static.py``). The worker itself runs in real SGLang servers on a GPU host
(``tests/gpu_sglang/``: greedy equality with DFLASH, sampled acceptance, performance). See
docs/adapter.md.

What is DFlash's and what is new:

* prefill (EXTEND), idle batches, draft-model loading, CUDA graphs of the *draft* forward, the
  draft KV materialization and the draft input carried between steps: DFlash's code, unchanged;
* decode: DFlash's draft forward over ``[root, MASK x L]`` (the drafter's LM head outside
  DFlash's graph, so the worker sees the per-position distributions instead of a greedy chain)
  -> the tree stage (LM head, fused top-k, tree kernel, links, positions, ancestor masks; with a
  DFlash2 drafter its candidate selector's lattice and the tree grown over it), replayed
  from a CUDA graph per batch size (``tree_stage.py``) -> the target verifies it as an NGRAM-style
  tree (``NgramVerifyInput`` with the ancestor-only custom mask, in the target's verify graphs
  captured reading the tree mask, see hooks.py) ->
  SGLang's ``eagle_sample`` accepts (greedy or target-only sampling, all sampling params) ->
  ``move_accept_tokens_to_target_kvcache`` compacts the target KV -> DFlash writes the drafter's
  KV for the committed path from the target's hidden states of the accepted rows.

The drafter's block and the verify window are two numbers. The drafter always drafts its own
block (``ResolvedDDTree.block``: DFlash's draft side is built with it, ``_drafter_block``); the
server's ``speculative_num_draft_tokens`` is the widest verify window (resolution.py), so SGLang
reserves KV, sizes its logits rows and captures its target verify graphs for it. With a budget
schedule each other window gets a target state of its own (an attention backend and verify graphs
for the batch sizes it serves, ``_WindowState``), and a step verifies with its batch size's window.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Optional

import torch
from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.lora.layers import unwrap_lora_layer
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
    enable_num_token_non_padded,
)
from sglang.srt.runtime_context import get_context, get_exec, get_parallel, get_spec
from sglang.srt.speculative.dflash_utils import is_dense_head_weight
from sglang.srt.speculative.dflash_worker_v2 import (
    DFlashWorkerV2,
    _resolve_dflash_embedding_module,
    _selector_lattice,
)
from sglang.srt.speculative.eagle_utils import eagle_sample
from sglang.srt.speculative.ngram_info import NgramVerifyInput
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import (
    GrammarTree,
    build_grammar_vocab_mask,
    commit_mamba_states_after_verify,
    draft_tp_context,
    move_accept_tokens_to_target_kvcache,
    prepare_mamba_track_for_verify,
)

from .. import knobs
from ..kernels.kv_move import kv_move_available, move_path_kv
from ..kernels.plant_path import PlantSource, plant_path
from .diagnostics import StepTimer, SyncWatch
from .hooks import (
    TREE_MASK_CAPTURED,
    TREE_VERIFY_MARKER,
    dense_conv_windows,
    enable_linear_tree_verify,
    hybrid_plan_of,
    install_graph_guard,
    install_tree_attention,
)
from .hybrid import HybridPlan
from .resolution import resolved_settings
from .settings import DDTreeConfigError, ResolvedDDTree, format_budget
from .tree_stage import GraphedTreeStage, backend_mask_buffer, eager_tree_stage
from .tree_step import lattice_tree_stage, run_tree_step, tree_stage
from .tree_verify import (
    AcceptedStep,
    TreeVerifyTensors,
    dense_head_topk,
    full_mask_size_bound,
    vocab_parallel_head_topk,
)

logger = logging.getLogger(__name__)


def mask_size_bound(batch: ScheduleBatch, window: int, context_len: int) -> Optional[int]:
    """The step's FULL-mask size bound from host data (``full_mask_size_bound``), or None.

    None where the exact host lengths are known (``batch.seq_lens_cpu``), where SGLang reserved
    nothing on the host (no ``nxt_kv_lens_cpu``: the exact size then costs a sync), or with
    ``knobs.EXACT_MASK_SIZE`` on (one sync a step, for measuring and debugging).
    """
    reserved = getattr(batch.spec_info, "nxt_kv_lens_cpu", None)
    if batch.seq_lens_cpu is not None or reserved is None or knobs.EXACT_MASK_SIZE.get():
        return None
    return full_mask_size_bound(reserved[: len(batch.seq_lens)], window, context_len)


def path_kv_pool(allocator) -> Optional[MHATokenToKVPool]:
    """The KV pool ``kernels.kv_move`` may move the accepted path in, or None (SGLang's move then).

    The kernel moves each accepted path's KV (one program per request, nothing when the path is in
    place already); SGLang's move copies all ``bs * W`` entries in every layer.

    Only ``MHATokenToKVPool`` itself (no subclass: FP4/MXFP8/paged/unified pools move differently), on
    CUDA, with its Triton copy configured, token-major, without scale buffers; and not with
    ``knobs.PATH_KV_MOVE`` off.
    """
    if not knobs.PATH_KV_MOVE.get() or not kv_move_available():
        return None
    pool = allocator.get_kvcache()
    plain = (
        type(pool) is MHATokenToKVPool
        and getattr(pool, "_kv_copy_config", None) is not None
        and not getattr(pool, "use_hnd", False)
        and not getattr(pool, "use_native_move_kv_cache", False)
        and getattr(pool, "native_k_scale_buffer", None) is None
        and getattr(pool, "k_scale_buffer", None) is None
        and int(getattr(pool, "layer_num", 0)) > 0
        and getattr(pool, "data_ptrs", None) is not None
        and pool.data_ptrs.is_cuda
    )
    return pool if plain else None


def _check_hybrid(plan: Optional[HybridPlan]) -> None:
    """Refuse a hybrid target, or warn, as ``hybrid.hybrid_plan`` decided (None: not a hybrid target).

    A layout whose SGLang kernels give each tree node its parent's state is verified as a tree
    (``_enable_tree_state``); every other layout is refused, and ``--speculative-ddtree-allow-hybrid-unsafe``
    runs it verified against its predecessor's state, warned lossy.
    """
    if plan is None:
        return
    if plan.refusal is not None:
        raise DDTreeConfigError(plan.refusal)
    if plan.warning is not None and get_parallel().tp_rank == 0:
        logger.warning("%s", plan.warning)


def _plant_source(log: bool) -> Optional[PlantSource]:
    """``knobs.PLANT_PATH``'s planted path (the step-cost benchmark's), or None; a bad value plants nothing."""
    if not knobs.PLANT_PATH.is_set():
        return None
    value = knobs.PLANT_PATH.get()
    try:
        source = PlantSource(value)
    except ValueError as exc:
        logger.warning("%s=%r is not valid (%s); no path is planted", knobs.PLANT_PATH.name, value, exc)
        return None
    if log:
        logger.warning(
            "DDTREE: %s=%r: every step accepts the planted path, not the target's (a benchmark, lossy)",
            knobs.PLANT_PATH.name,
            value,
        )
    return source


class DDTreeVerifyInput(NgramVerifyInput):
    """SGLang's NGRAM tree-verify input, marked as DDTree's (the CUDA-graph guard keys on it).

    It replays the target's TARGET_VERIFY graph when that graph was captured reading the tree mask
    (hooks.after_get_spec_info); otherwise the guard makes the verify run eagerly.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        setattr(self, TREE_VERIFY_MARKER, True)


@dataclass
class _Verified:
    logits_output: Any
    target_out: Any
    # Filled by the acceptance (eagle_sample's outputs, as SGLang's KV mover wants them).
    predict: Optional[torch.Tensor] = None
    accept_index: Optional[torch.Tensor] = None


@contextlib.contextmanager
def _spec_width(source: str, num_draft_tokens: int, cuda_graph_bs: Optional[list] = None):
    """SGLang's ``speculative_num_draft_tokens`` (and decode graph sizes) set for the block inside.

    SGLang's runners and attention backends read these from the published configuration when they
    are built; each is restored on exit, as SGLang's adaptive EAGLE builds its per-width states.
    """
    saved = {"speculative_num_draft_tokens": get_spec().speculative_num_draft_tokens}
    fields: dict = {"speculative_num_draft_tokens": int(num_draft_tokens)}
    if cuda_graph_bs is not None:
        saved["cuda_graph_bs_decode"] = get_exec().graph.cuda_graph_bs_decode
        fields["cuda_graph_bs_decode"] = list(cuda_graph_bs)
    if all(saved[k] == v for k, v in fields.items()):
        yield
        return
    get_context().override(f"ddtree.{source}", **fields)
    try:
        yield
    finally:
        get_context().override(f"ddtree.{source}_restore", **saved)


@dataclass
class _WindowState:
    """A verify window's target side: the attention backend and verify graph runner it runs with."""

    window: int
    attn_backend: Any
    graph_runner: Any  # None: eager verify
    batch_sizes: list


class _WorkerPorts:
    """``tree_step.TreeStepPorts`` on SGLang's machinery, for one batch."""

    def __init__(self, worker: "DDTreeWorker", batch: ScheduleBatch, grammar_barrier, on_publish, window: int):
        self.worker = worker
        self.batch = batch
        self.grammar_barrier = grammar_barrier
        self.on_publish = on_publish
        self.window = window
        self.kv_loc_plan = None
        self.draft_loc_2d: Optional[torch.Tensor] = None  # [bs, block]: the drafter's KV slots
        self.window_loc_2d: Optional[torch.Tensor] = None  # [bs, window]: the target verify's slots

    # 1. draft
    def draft_hidden(self, root_tokens: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
        hidden, self.kv_loc_plan, self.draft_loc_2d = self.worker._draft_block_hidden(
            self.batch, root_tokens, prefix_lens
        )
        self.window_loc_2d = self.worker._verify_locations(self.batch, prefix_lens, self.draft_loc_2d, self.window)
        return hidden

    # 2. drafter distributions
    def head_topk(self, hidden_rows: torch.Tensor, k: int):
        return self.worker._head_topk(hidden_rows, k)

    # 4. verify
    def verify(self, tensors: TreeVerifyTensors) -> _Verified:
        return self.worker._verify_tree(self.batch, tensors, self.window_loc_2d, self.window)

    # 5. accept
    def accept(self, tensors: TreeVerifyTensors, verified: _Verified):
        return self.worker._accept_tree(self.batch, tensors, verified, self.grammar_barrier)

    # 6. commit
    def commit(self, tensors: TreeVerifyTensors, verified: _Verified, step: AcceptedStep) -> None:
        self.worker._commit_path(
            self.batch, tensors, verified, step, self.kv_loc_plan, self.draft_loc_2d, self.on_publish
        )


class DDTreeWorker(DFlashWorkerV2):
    """DFlash drafting + DDTree tree verification (spec-v2 worker, overlap capable).

    Longer than 300 lines because it is one SGLang worker: the methods override or feed ``DFlashWorkerV2``'s
    own (the draft forward, the verify windows, the tree step's ports, the commit) and share its buffers and
    runners; the step's logic lives outside it, in ``tree_step`` (control flow), ``tree_verify`` (tensors)
    and the kernels, which the CPU suite tests.
    """

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker):
        settings = resolved_settings(server_args)
        if settings is None:
            raise DDTreeConfigError(
                "DDTreeWorker needs a server_args record resolved with --speculative-algorithm "
                "DDTREE (it carries no DDTree settings)"
            )
        # DFlash's draft side (draft runner, its graphs and attention backend, block buffers) is
        # built for the drafter's block; the target's side was built for the verify window.
        with _spec_width("drafter_block", settings.block):
            super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.ddtree: ResolvedDDTree = settings
        if int(self.block_size) != settings.block:
            raise DDTreeConfigError(
                f"DDTREE: the DFlash block size is {self.block_size} but the resolved drafter block is {settings.block}"
            )
        if self.lilicorr is not None or self._is_domino:
            raise DDTreeConfigError(
                "DDTREE supports DFlash and DFlash2 drafters; this draft model has a LiLiCorr head / Domino rollout"
            )
        if self.selector is not None:
            self._attach_selector_head()
        self._hybrid = hybrid_plan_of(self.target_worker.model_runner)
        _check_hybrid(self._hybrid)
        if self._hybrid is not None and self._hybrid.tree_state:
            self._enable_tree_state()
        install_graph_guard()
        # The grouped tree-verify attention kernel (hooks.install_tree_attention; knobs.TREE_ATTENTION off:
        # SGLang's); also applied before the target's verify graphs are captured, in after_get_spec_info.
        install_tree_attention(getattr(self.target_worker.model_runner, "attn_backend", None))
        self._graph_use_logged: set = set()  # the windows whose first step was logged
        self._tree_stages: dict[int, GraphedTreeStage] = {}
        self._tree_mask_buffers: dict[int, Optional[torch.Tensor]] = {}
        # Built at the first decode step: the target's KV pools and graphs do not exist yet here.
        self._window_states: Optional[dict[int, _WindowState]] = None
        self._step_timer = StepTimer.from_env(log=get_parallel().tp_rank == 0)
        self._sync_watch = SyncWatch.from_env(log=get_parallel().tp_rank == 0)
        self._path_kv_pool = None  # path_kv_pool's answer (False: SGLang's move), at the first commit
        self._context_len = int(self.target_worker.model_runner.model_config.context_len)
        self._plant = _plant_source(log=get_parallel().tp_rank == 0)
        if get_parallel().tp_rank == 0:
            logger.info(
                "DDTREE worker ready: budget=%s, top_k=%d, drafter block=%d, verify window=%d, tree from %s.",
                format_budget(settings.schedule or settings.budget),
                settings.effective_top_k,
                settings.block,
                settings.window,
                "the DFlash2 selector's lattice (%d candidates a slot)" % int(self.selector.top_k)
                if self.selector is not None
                else "the drafter's per-position distributions",
            )

    # ---- hybrid targets: each tree node's recurrent state from its parent's --------------------

    def _enable_tree_state(self) -> None:
        """SGLang's tree path for linear attention on the target (``hybrid.TREE_VERIFY_REQUIREMENTS``): the
        dense conv-window cache (kept by the start-up hook ``around_conv_window_dedup``) and ``topk > 1`` on
        the linear-attention backends (set before the verify graphs by ``after_get_spec_info``; here for the
        eager verify and each window state's backend). The commit is ``commit_mamba_states_after_verify``'s."""
        pool = getattr(self.target_worker.model_runner.req_to_token_pool, "mamba_pool", None)
        windows = getattr(getattr(pool, "mamba_cache", None), "intermediate_conv_window", None)
        if not dense_conv_windows(windows):
            raise DDTreeConfigError(
                "DDTREE on a hybrid target needs the dense speculative conv-window cache, but the mamba pool's "
                "mamba_cache.intermediate_conv_window is deduplicated for a chain or missing (the overlay's start-up "
                "hook on conv_window_dedup_enabled did not run, or this SGLang keeps the windows elsewhere)"
            )
        model_runner = self.target_worker.model_runner
        enable_linear_tree_verify(self.ddtree.effective_top_k, model_runner.attn_backend)

    # ---- verify windows ---------------------------------------------------------------------

    def _target_capture_bs(self) -> list[int]:
        runner = getattr(self.target_worker.model_runner, "decode_cuda_graph_runner", None)
        return [int(b) for b in (getattr(runner, "capture_bs", None) or [])]

    def _window_batch_sizes(self, window: int) -> list[int]:
        """The captured batch sizes a window serves, and its schedule entry's own largest size.

        Batches pad up to these sizes, so the top of each window's range is among them.
        """
        sizes = self._target_capture_bs()
        if not sizes:
            return []
        served = set(self.ddtree.window_batch_sizes(sizes).get(window, []))
        for max_bs, budget in self.ddtree.schedule:
            if budget + 1 == window and max_bs <= max(sizes):
                served.add(int(max_bs))
        return sorted(served)

    def _build_window_states(self) -> dict[int, "_WindowState"]:
        """A target state for each scheduled window other than the server's (SGLang built that one).

        Each gets an attention backend of its own (its buffers are sized by the window) and, where
        the target has decode graphs, a verify graph runner captured with the tree mask for the
        batch sizes the window serves.
        """
        if not self.ddtree.schedule:
            return {}
        model_runner = self.target_worker.model_runner
        graphs = getattr(model_runner, "decode_cuda_graph_runner", None) is not None
        windows = sorted({res.window for res in (self.ddtree.for_batch(bs) for bs, _ in self.ddtree.schedule)})
        states = {}
        for window in windows:
            if window == self.ddtree.window:
                continue
            sizes = self._window_batch_sizes(window)
            with _spec_width("verify_window", window, sizes if graphs and sizes else None):
                saved_workspace = model_runner.init_new_workspace
                try:
                    backend = model_runner._get_attention_backend(init_new_workspace=True)
                finally:
                    model_runner.init_new_workspace = saved_workspace
                install_tree_attention(backend)
                if self._hybrid is not None and self._hybrid.tree_state:
                    enable_linear_tree_verify(self.ddtree.effective_top_k, backend)
                runner = None
                if graphs and sizes:
                    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

                    runner = DecodeCudaGraphRunner(
                        model_runner, attn_backend=backend, speculative_num_draft_tokens=window
                    )
            states[window] = _WindowState(window=window, attn_backend=backend, graph_runner=runner, batch_sizes=sizes)
        if get_parallel().tp_rank == 0:
            logger.info(
                "DDTREE verify windows: %d for batch sizes %s (SGLang's target graphs); %s.",
                self.ddtree.window,
                self._window_batch_sizes(self.ddtree.window),
                "; ".join(
                    "%d for %s (%s)" % (w, s.batch_sizes, "graphs" if s.graph_runner is not None else "eager")
                    for w, s in states.items()
                ),
            )
        return states

    @contextlib.contextmanager
    def _target_window(self, window: int):
        """The target runs with the window's attention backend and verify graphs inside the block."""
        state = (self._window_states or {}).get(window)
        if state is None:
            yield
            return
        model_runner = self.target_worker.model_runner
        saved = (model_runner.attn_backend, model_runner.decode_cuda_graph_runner)
        model_runner.attn_backend = state.attn_backend
        model_runner.decode_cuda_graph_runner = state.graph_runner
        try:
            yield
        finally:
            model_runner.attn_backend, model_runner.decode_cuda_graph_runner = saved

    # The drafter's LM head must stay eager: DDTree needs its distributions, not a greedy chain.
    def _maybe_build_draft_sampler(self):
        return None

    # ---- entry point ------------------------------------------------------------------------

    def forward_batch_generation(
        self,
        batch: ScheduleBatch,
        on_publish=None,
        grammar_barrier=None,
        pp_proxy_tensors=None,
    ) -> GenerationBatchResult:
        if (
            batch.forward_mode.is_extend()
            or batch.is_extend_in_batch
            or batch.forward_mode.is_idle()
            or batch.spec_info is None
        ):
            # Prefill and idle batches: exactly DFlash's path.
            return super().forward_batch_generation(
                batch,
                on_publish=on_publish,
                grammar_barrier=grammar_barrier,
                pp_proxy_tensors=pp_proxy_tensors,
            )
        return self._forward_tree_decode(batch, on_publish, grammar_barrier)

    def _forward_tree_decode(self, batch: ScheduleBatch, on_publish, grammar_barrier):
        draft_input = batch.spec_info
        batch.seq_lens.record_stream(torch.get_device_module(self.device).current_stream())
        prefix_lens = batch.seq_lens
        if self._window_states is None:
            self._window_states = self._build_window_states()
        step_settings = self.ddtree.for_batch(len(batch.seq_lens))
        window = step_settings.window
        ports = _WorkerPorts(self, batch, grammar_barrier, on_publish, window)
        timer = self._step_timer
        if timer is not None:
            ports = timer.wrap(ports)
        with self._sync_watch.step() if self._sync_watch is not None else contextlib.nullcontext():
            stage = self._graphed_tree_stage(step_settings)
            result = run_tree_step(
                ports,
                step_settings,
                root_tokens=draft_input.bonus_tokens.view(-1),
                prefix_lens=prefix_lens,
                prefix_lens_cpu=batch.seq_lens_cpu,
                mask_size_bound=mask_size_bound(batch, window, self._context_len),
                stage=stage if timer is None else timer.wrap_stage(stage),
            )
        if timer is not None:
            timer.end_step(len(batch.seq_lens))
        step = result.step
        can_run_graph = bool(result.verified.target_out.can_run_cuda_graph)
        if window not in self._graph_use_logged and get_parallel().tp_rank == 0:
            self._log_first_step(window, stage, can_run_graph)
        new_seq_lens = prefix_lens + step.accept_lens.to(prefix_lens.dtype)
        # (on_publish ran inside the commit, before the drafter-KV writes, as in DFlash.)
        logits_output = result.verified.logits_output
        logits_output.hidden_states = None  # no large D2H copies under overlap scheduling
        batch.forward_mode = ForwardMode.DECODE
        next_draft_input = self._make_next_draft_input_decode(bonus_tokens=step.bonus, new_seq_lens=new_seq_lens)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=step.out_tokens.reshape(-1),
            accept_lens=step.accept_lens,
            can_run_cuda_graph=can_run_graph,
            next_draft_input=next_draft_input,
            speculative_num_draft_tokens=int(window),
            new_seq_lens=new_seq_lens,
            routed_experts_output=result.verified.target_out.routed_experts_output,
            indexer_topk_output=result.verified.target_out.indexer_topk_output,
        )

    def _log_first_step(self, window: int, stage: GraphedTreeStage, can_run_graph: bool) -> None:
        """Say once per verify window what its first step ran: graphs, tree stage, mask, KV move, attention.

        The target's graphs are captured after this worker is built, so only a step can tell.
        """
        state = self._window_states.get(window)
        runner = (
            state.graph_runner
            if state is not None
            else getattr(self.target_worker.model_runner, "decode_cuda_graph_runner", None)
        )
        logger.info(
            "DDTREE tree verify (window %d): CUDA graph replay %s (target verify graphs %s the tree mask); "
            "tree stage: %s; FULL mask: %s; KV move: %s; verify attention: %s.",
            window,
            "on" if can_run_graph else "off for this batch",
            "read" if getattr(runner, TREE_MASK_CAPTURED, False) else "do not read",
            "CUDA graphs for batch sizes %s" % stage.captured_sizes if stage.enabled else "eager",
            "written by the stage into the attention backend's buffer"
            if self._tree_mask_buffers.get(window) is not None
            else "allocated per step",
            "the path only, per request" if self._path_kv_pool else "SGLang's",
            "the grouped tree kernel"
            if getattr(
                getattr(getattr(self.target_worker.model_runner, "attn_backend", None), "extend_attention_fwd", None),
                "_ddtree_tree_attention",
                False,
            )
            else "SGLang's extend kernel",
        )
        self._graph_use_logged.add(window)

    def _graphed_tree_stage(self, step_settings: ResolvedDDTree) -> GraphedTreeStage:
        """Steps 2-3 of the tree step, replayed from CUDA graphs where the target has decode graphs.

        One per verify window, built at its first decode step, for the batch sizes its target graphs
        serve (``_window_batch_sizes``; batches are padded up to them, larger ones run eagerly).
        Eager with ``knobs.EAGER_TREE_STAGE`` and without target graphs. At TP > 1 the capture runs
        inside SGLang's ``graph_capture`` (``_stage_capture_context``).

        Where the target's attention backend has a FULL-layout verify-mask buffer
        (``tree_stage.backend_mask_buffer``), the stage writes the step's FULL mask into it, graphed
        or eager: the verify input is then a view of the buffer and the backend's replay copy a copy
        onto itself. Each step's stage and verify are enqueued on one stream, so a step's write
        never overtakes the previous step's verify reading the buffer.
        """
        window = step_settings.window
        stage = self._tree_stages.get(window)
        if stage is None:
            state = self._window_states.get(window)
            model_runner = self.target_worker.model_runner
            backend = state.attn_backend if state is not None else getattr(model_runner, "attn_backend", None)
            sizes = self._window_batch_sizes(window) if self.ddtree.schedule else self._target_capture_bs()
            enabled = bool(sizes) and not eager_tree_stage()
            mask_buffer = backend_mask_buffer(backend)
            self._tree_mask_buffers[window] = mask_buffer
            stage = self._tree_stages[window] = GraphedTreeStage(
                lattice_tree_stage(self._selector_lattice, step_settings, mask_out=mask_buffer)
                if self.selector is not None
                else tree_stage(self._head_topk, step_settings, mask_out=mask_buffer),
                batch_sizes=sizes,
                enabled=enabled,
                capture_context=self._stage_capture_context(),
            )
        return stage

    # ---- 1. draft (DFlash's draft forward, eager block preparation) -------------------------

    def _draft_block_slots(self, batch: ScheduleBatch, root_tokens, prefix_lens):
        """The drafter's block in DFlash's buffers: ids ``[root, MASK, ...]``, positions ``prefix + i`` and the
        KV slots it writes, each ``[bs, block]``."""
        bs = len(batch.seq_lens)
        block = int(self.block_size)
        self._ensure_draft_block_buffers(bs)
        block_ids = self._draft_block_ids_buf[:bs]
        positions_2d = self._draft_block_positions_buf[:bs]
        loc_2d = self._draft_verify_out_cache_loc_buf[:bs]
        block_ids.fill_(int(self._mask_token_id))
        block_ids[:, 0].copy_(root_tokens)
        torch.add(prefix_lens.unsqueeze(1), self._block_pos_offsets, out=positions_2d)
        loc = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=self.model_runner.req_to_token_pool.req_to_token,
            start_offset=prefix_lens,
            end_offset=prefix_lens + block,
            batch_size=bs,
            draft_token_num=block,
            device=self.device,
        )
        loc_2d.copy_(loc.view(bs, block))
        return block_ids, positions_2d, loc_2d

    def _draft_block_hidden(self, batch: ScheduleBatch, root_tokens, prefix_lens):
        bs = len(batch.seq_lens)
        block = int(self.block_size)
        device = self.device
        block_ids, positions_2d, loc_2d = self._draft_block_slots(batch, root_tokens, prefix_lens)
        input_embeds = self._draft_block_embeds(block_ids)
        positions = positions_2d.reshape(-1)
        out_cache_loc = loc_2d.reshape(-1)

        draft_input = batch.spec_info
        kv_loc_plan = self.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            seq_lens_cpu=(batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu),
            write_virtual=out_cache_loc,
            read_extent=block,
        )
        seq_lens_cpu, seq_lens_sum = self._draft_seq_lens(batch, draft_input, bs, block)

        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            out_cache_loc=out_cache_loc,
            seq_lens_sum=seq_lens_sum,
            seq_lens_cpu=seq_lens_cpu,
            positions=positions,
            input_embeds=input_embeds,
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            num_token_non_padded=(
                torch.full((), bs * block, dtype=torch.int32, device=device) if enable_num_token_non_padded() else None
            ),
            global_num_token_non_padded_cpu=bs * block,
            can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
        )
        kv_loc_plan.bind(forward_batch, self.draft_model_runner.kv_index_translator)
        with torch.inference_mode(), draft_tp_context(self.draft_parallel_layout):
            draft_out = self.draft_model_runner.forward(forward_batch)
        hidden = draft_out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE: the DFlash draft model returned no hidden states")
        return hidden.view(bs, block, -1), kv_loc_plan, loc_2d

    def _draft_block_embeds(self, block_ids: torch.Tensor) -> torch.Tensor:
        """``[bs * block, H]``: the block ``[root, MASK, ...]`` embedded as DFlash embeds it (the target's
        embedding, or DFlash's full copy of it, times its noise scale)."""
        if self._full_embed_gpu is not None:
            noise = torch.nn.functional.embedding(block_ids, self._full_embed_gpu)
        else:
            target_model = self.target_worker.model_runner.model
            embed = unwrap_lora_layer(_resolve_dflash_embedding_module(self.draft_model, target_model))
            noise = embed(block_ids)
        if self._noise_embed_scale != 1.0:
            noise = noise * self._noise_embed_scale
        return noise.view(-1, noise.shape[-1])

    def _draft_seq_lens(self, batch: ScheduleBatch, draft_input, bs: int, block: int):
        """The draft forward's host lengths and their sum, without a device sync: the batch's own lengths plus
        the block where it carries them, else SGLang's reserved lengths, else each request's allocated KV."""
        seq_lens_cpu = self._draft_seq_lens_cpu_buf[:bs]
        if batch.seq_lens_cpu is not None:
            seq_lens_cpu.copy_(batch.seq_lens_cpu)
            seq_lens_cpu.add_(block)
            return seq_lens_cpu, int(seq_lens_cpu.sum())
        if draft_input.nxt_kv_lens_cpu is not None:
            seq_lens_cpu.copy_(draft_input.nxt_kv_lens_cpu)
            return seq_lens_cpu, int(draft_input.nxt_kv_lens_sum)
        for i, req in enumerate(batch.reqs):
            seq_lens_cpu[i] = req.kv.kv_allocated_len
        return seq_lens_cpu, int(seq_lens_cpu.sum())

    def _stage_capture_context(self):
        """What the tree stage's graphs are captured inside: at TP > 1 SGLang's ``graph_capture`` (the
        vocab-parallel head all-gathers through the communicator its own decode graphs capture), in the
        drafter's TP context the head runs in; None at TP 1."""
        if int(get_parallel().tp_group.world_size) == 1:
            return None
        from sglang.srt.distributed.parallel_state import graph_capture
        from sglang.srt.model_executor.runner_utils.pool import get_or_create_global_graph_capture_stream

        layout = self.draft_parallel_layout

        @contextlib.contextmanager
        def capture():
            with draft_tp_context(layout), graph_capture(stream=get_or_create_global_graph_capture_stream()) as ctx:
                yield ctx

        return capture

    def _verify_locations(self, batch: ScheduleBatch, prefix_lens, draft_loc_2d, window: int) -> torch.Tensor:
        """``[bs, window]`` KV slots the target verify writes (the drafter's when the widths match)."""
        bs = len(batch.seq_lens)
        if int(draft_loc_2d.shape[1]) == window:
            return draft_loc_2d
        loc = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=self.model_runner.req_to_token_pool.req_to_token,
            start_offset=prefix_lens,
            end_offset=prefix_lens + window,
            batch_size=bs,
            draft_token_num=window,
            device=self.device,
        )
        return loc.view(bs, window)

    # ---- 2. drafter distributions through the target LM head --------------------------------

    def _head_topk(self, hidden_rows: torch.Tensor, k: int):
        lm_head = unwrap_lora_layer(getattr(self.target_worker.model_runner.model, "lm_head", None))
        if lm_head is None:
            raise RuntimeError("DDTREE needs the target model's lm_head")
        vocab = int(self.model_runner.model_config.vocab_size)
        with draft_tp_context(self.draft_parallel_layout):
            tp_group = get_parallel().tp_group
            weight = getattr(lm_head, "weight", None)
            if weight is not None and is_dense_head_weight(weight) and not hasattr(lm_head, "shard_indices"):
                if int(tp_group.world_size) != 1:
                    raise RuntimeError("DDTREE: a TP-sharded lm_head without shard_indices")
                return dense_head_topk(hidden_rows, weight, k, vocab_size=min(vocab, int(weight.shape[0])))
            if weight is not None and is_dense_head_weight(weight):
                shard = lm_head.shard_indices
                if int(shard.num_added_elements) != 0:
                    raise RuntimeError("DDTREE does not support an lm_head with added vocabulary")
                return vocab_parallel_head_topk(
                    hidden_rows,
                    weight,
                    k,
                    num_org=int(shard.num_org_elements),
                    vocab_start=int(shard.org_vocab_start_index),
                    world_size=int(tp_group.world_size),
                    all_gather=lambda t: tp_group.all_gather(t, dim=0),
                )
            # Quantized head: its own kernel, as DFlash does for greedy (TP 1 only).
            if int(tp_group.world_size) != 1:
                raise RuntimeError("DDTREE with a quantized lm_head is only supported at tp=1")
            logits = lm_head.quant_method.apply(lm_head, hidden_rows, None)[:, :vocab]
            from ..kernels.draft_topk import draft_topk_fast

            return draft_topk_fast(logits, k)

    # ---- 2. (DFlash2) the candidate selector's lattice -----------------------------------------

    def _attach_selector_head(self) -> None:
        """A DFlash2 drafter has no head of its own: its candidates are the target LM head's top-K over
        the drafter's rows (``compute_candidates``), so the head is attached here, as DFlash attaches it
        before its draft graphs."""
        lm_head = unwrap_lora_layer(getattr(self.target_worker.model_runner.model, "lm_head", None))
        if lm_head is None:
            raise DDTreeConfigError("DDTREE with a DFlash2 drafter needs the target model's lm_head")
        if not (
            is_dense_head_weight(getattr(lm_head, "weight", None))
            or should_apply_lm_head_quant_method(lm_head, getattr(lm_head, "quant_method", None))
        ):
            raise DDTreeConfigError("DDTREE with a DFlash2 drafter: the target's lm_head quantization is unsupported")
        self.draft_model.lm_head = lm_head

    def _selector_lattice(self, hidden_rows: torch.Tensor, root_tokens: torch.Tensor):
        """``(candidate_ids [bs, L, K], scores [bs, L, K, K])`` of the drafter's rows 1..L, slot 0 given the
        root: SGLang's own selector (``_selector_lattice``), fixed shapes and no host sync."""
        with draft_tp_context(self.draft_parallel_layout):
            return _selector_lattice(self.draft_model, hidden_rows, root_tokens.to(torch.int64))

    # ---- 4. target verify over the tree (eager, custom mask) --------------------------------

    def _verify_tree(self, batch: ScheduleBatch, tensors: TreeVerifyTensors, window_loc_2d, window: int) -> _Verified:
        batch.out_cache_loc = window_loc_2d.reshape(-1)
        batch.input_ids = tensors.draft_token
        batch.forward_mode = ForwardMode.TARGET_VERIFY
        prepare_mamba_track_for_verify(batch)
        batch.spec_info = DDTreeVerifyInput(
            draft_token=tensors.draft_token,
            custom_mask=tensors.custom_mask,
            positions=tensors.positions,
            retrieve_index=tensors.retrieve_index,
            retrieve_next_token=tensors.retrieve_next_token,
            retrieve_next_sibling=tensors.retrieve_next_sibling,
            draft_token_num=tensors.window,
        )
        with self._target_window(window):
            target_out = self.target_worker.forward_batch_generation(
                batch, is_verify=True, capture_hidden_mode=CaptureHiddenMode.FULL
            )
        logits_output = target_out.logits_output
        target_lp = self._target_logits_processor
        if target_lp is not None and target_lp.is_deferred_shard(logits_output.next_token_logits):
            logits_output.next_token_logits = target_lp.finish_deferred_gather(logits_output.next_token_logits)
        return _Verified(logits_output=logits_output, target_out=target_out)

    # ---- 5. acceptance: SGLang's tree acceptance ---------------------------------------------

    def _accept_tree(self, batch, tensors: TreeVerifyTensors, verified: _Verified, grammar_barrier):
        grammar_mask = None
        if batch.has_grammar:
            bs = len(batch.seq_lens)
            grammar_mask = build_grammar_vocab_mask(
                reqs=batch.reqs,
                tree=GrammarTree.from_host(
                    tensors.retrieve_next_token.cpu(),
                    tensors.retrieve_next_sibling.cpu(),
                    tensors.draft_token.view(bs, -1).cpu(),
                ),
                sampling_info=batch.sampling_info,
                device=tensors.retrieve_next_token.device,
                barrier=grammar_barrier,
            )
        predict, accept_lens, accept_index = eagle_sample(
            batch.spec_info,
            batch,
            verified.logits_output,
            grammar_mask,
            watermark_state=self.model_runner.watermark_state,
        )
        plant = self._plant.current() if self._plant is not None else None
        if plant is not None:
            tree = tensors.tree
            plant_path(tree.parents, tree.tokens, predict, accept_index, accept_lens, plant, self.ddtree.block - 1)
        verified.predict, verified.accept_index = predict, accept_index
        return predict, accept_lens, accept_index

    # ---- 6. commit the path: target KV compaction, drafter KV from target hidden states ------

    def _commit_path(
        self, batch, tensors, verified: _Verified, step: AcceptedStep, kv_loc_plan, draft_loc_2d, on_publish
    ):
        accept_index = verified.accept_index  # [bs, W] flat verify rows, -1 after the path
        if self._need_mamba_verify_commit:
            commit_mamba_states_after_verify(self.target_worker, batch, step.accept_lens, accept_index, tensors.window)
        # Target KV of the root and accepted nodes -> the front of the window, in path order.
        if self._path_kv_pool is None:
            self._path_kv_pool = path_kv_pool(self.model_runner.token_to_kv_pool_allocator) or False
        pool = self._path_kv_pool
        if pool and batch.out_cache_loc.numel() == accept_index.numel():
            move_path_kv(
                pool.data_ptrs,
                pool.data_strides,
                batch.out_cache_loc,
                accept_index,
                step.accept_lens,
                pool._kv_copy_config,
                max_path=self.ddtree.block,
            )
        else:
            move_accept_tokens_to_target_kvcache(
                batch, accept_index, step.accept_lens - 1, self.model_runner.token_to_kv_pool_allocator
            )
        if batch.return_logprob:
            compute_spec_logprobs(batch, verified.logits_output, verified.predict, accept_index=accept_index)
        if on_publish is not None:
            on_publish(batch.seq_lens + step.accept_lens.to(batch.seq_lens.dtype))
        # Drafter KV for the committed path, from the target hidden states of the path's rows
        # (DFlash's own writer over the drafter's block: a path is at most a block long, the root
        # and one node per draft position; rows past accept_lens are never written).
        hidden = verified.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE verify needs the target's hidden states, got None")
        # A path has at most min(window, block) tokens: the columns written are those.
        cols = min(int(draft_loc_2d.shape[1]), int(step.path_rows.shape[1]))
        hidden = hidden.view(-1, hidden.shape[-1])[step.path_rows[:, :cols].reshape(-1)]
        cache_loc_2d = self._draft_write_ids(kv_loc_plan).view(draft_loc_2d.shape)[:, :cols].contiguous()
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden,
            cache_loc=cache_loc_2d.reshape(-1),
            cache_loc_2d=cache_loc_2d,
            positions=step.path_positions[:, :cols].reshape(-1),
            commit_lens=step.accept_lens,
        )
