#!/usr/bin/env bash
# On the device (through the device tool's `run`): tests/gpu_sglang/device-run.sh STEP...
#   train   train the target and the DFlash drafter (train_models.py) -> models.tgz, train.json; with
#           SYNTH_LANG=pairs (synth_lang.py) every step uses that language and its models (models-pairs,
#           models-pairs.tgz); SYNTH_LANG=code|prose: real text (corpus_lang.py, the bundles in corpora/),
#           models-code / models-prose, levels tiny-code-dflash-{low,mid,high} (EMBED_LEVELS below)
#   tp1     the TP=1 scenario (scenario.py tp1) -> results-tp1.json
#   sampled the T = 1 runs of tp1 again, one --random-seed per server -> results-sampled.json
#   tp2     the TP=2 scenario (scenario.py tp2, kind nvidia-h200-x2) -> results-tp2.json
#   topk    the fused draft top-k benchmark (sglang_overlay/benchmarks/draft_topk.py) -> results-topk.json
#   perf    tokens/s of NONE, DFLASH, DDTREE before and after (perf.py) -> results-perf.json;
#           PERF_TARGET=qwen3-8b | qwen3-30b-a3b: on a production-shaped random target (make_shaped.py writes
#           its configs);
#           PERF_TARGET=embedded-qwen3-8b | embedded-qwen3-30b-a3b: on the embedded test bed (step embed, run
#           first when the bed is missing; PERF_DRAFTER picks the drafter level; PERF_DRAFTER=A,B runs perf
#           once per level -> results-perf-A.json, results-perf-B.json)
#   embed   the embedded test bed for EMBED_SHAPE (default qwen3-8b; qwen3-30b-a3b): trains the drafter levels
#           EMBED_LEVELS when MODELS lacks them (train_models.py --drafter-levels -> drafter-levels.tgz, keep it
#           in .cache/gpu-sglang/drafters/), then embeds the tiny target and the drafters tiny-qwen3-dflash +
#           the levels into /tmp/gs/embedded-SHAPE (embed_models.py; EMBED_LAYERS trims the target, default
#           24 for the 30B-A3B; EMBED_ROOT=/dev/shm keeps the bed in memory, room for its 48 layers, linked
#           from there); a warm machine that holds the same bed skips it; EMBED_VERIFY=1 then compares
#           tiny and embedded logits in float32 on the GPU (embed-SHAPE.json in logs.tgz); DFLASH2=1 adds the
#           DFlash2 drafter DFLASH2_NAME to the bed (trained first, as step dflash2, when MODELS lacks it; its
#           verify also compares the lattices)
#   dflash2 a DFlash2 drafter for the models' target (train_models.py --dflash2: SGLang's DFlash2DraftModel,
#           grouped convolutions and a candidate selector) -> MODELS/DFLASH2_NAME (default tiny-qwen3-dflash2),
#           dflash2-drafter.tgz (keep it in .cache/gpu-sglang/drafters/; with the target trained in the same
#           run, LANG_DIR.tgz), train-DFLASH2_NAME.json (offline acceptance: the selector's greedy path, the
#           marginals' chain, DDTrees over the marginals); it trains for TRAIN_LIMIT_S (default 180) or, with
#           DFLASH2_ACCEPT, until the offline acceptance of the selector's path reaches it. Serve it with
#           PERF_DRAFTER / SCENARIO_DRAFTER (scenario.py's tp1 and sampled servers) = DFLASH2_NAME
#   attn    the tree-verify attention kernel against SGLang's Triton extend kernel, causal and masked
#           (sglang_overlay/benchmarks/tree_attention.py; ATTN_ARGS adds its options) -> results-attn.json
#   stage   the graphed tree stage == the eager one, and its time (sglang_overlay/tests/adapter/
#           gpu_stage_check.py) -> results-stage.json
#   profile GPU time per decode step, DFLASH against DDTREE, kernel by kernel (profile_step.py, SGLang's
#           torch profiler; PERF_TARGET as for perf, default qwen3-8b) -> results-profile-TARGET.json
#   weak    a drafter less sure of itself (train_models.py --drafter-only, stops at offline acceptance
#           WEAK_ACCEPT, default 5) for the trained target -> MODELS/tiny-qwen3-dflash-weak, weak-drafter.tgz
#   autotune the autotune grid measured and chosen with the collection's code (autotune_real.py), once per
#           drafter in AUTOTUNE_DRAFTERS (default tiny-qwen3-dflash) -> results-autotune-DRAFTER.json;
#           AUTOTUNE_TARGET as PERF_TARGET (an embedded bed is made first when missing)
#   plant   the decode step's cost by accepted path: DDTREE with planted first/middle/last-sibling paths against
#           DFLASH, short and long prompts, profiled (plant_bench.py; PERF_TARGET default qwen3-8b) -> results-plant-TARGET.json
#   checks  spec_verify and the predicates CLI against the real SGLang with the release -> checks.json
#   traffic real traffic (traffic.py): radix cache on, chunked prefill of 4k-16k prompts, greedy and sampled in one
#           batch, streaming, aborts; DDTREE vs NONE and the control, TRAFFIC_LIMIT_S (420) -> results-traffic.json
#   hybrid  DDTREE on a hybrid target (Gated DeltaNet + full attention, train_hybrid.py; trained first when
#           MODELS_HYBRID lacks it -> models-hybrid.tgz, keep it in .cache/gpu-sglang/ for later calls): NONE,
#           DDTREE budgets 15 and 31 (--speculative-ddtree-allow-hybrid-unsafe) and the control
#           (DDTREE_HYBRID_CHAIN_STATE=1), greedy mixed lengths + sampled chi-square (hybrid_check.py)
#           -> results-hybrid.json; prefill graphs off unless SCENARIO_PREFILL_GRAPHS=1 (a faster start)
# Models: from `train` in the same call, else .cache/gpu-sglang/models, else /tmp/gs/models (an earlier
# call on this warm machine), else docs/evidence/gpu-sglang/models.tgz.
# Everything lands in $OUT (at most 8 files): logs.tgz, results-*.json, train.json, checks.json, models.tgz.
# Each step's timeout keeps the call inside CALL_LIMIT seconds (default 585) so that $OUT is always packed.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd); H=$REPO/tests/gpu_sglang
W=/tmp/gs; mkdir -p "$W/logs"; OUT=${OUT:-$W/out}; mkdir -p "$OUT"
t0=$(date +%s); stamp() { echo "[device-run +$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( ${CALL_LIMIT:-585} - $(date +%s) + t0 )); }
export CALL_DEADLINE=$(( t0 + ${CALL_LIMIT:-585} - 10 ))  # perf.py and profile_step.py start no server they cannot finish by then
stamp "setup"
if [ -d /tmp/site/sglang ]; then SETUP_DONE=1; fi  # a warm machine that already ran the setup
export REPO SETUP_DONE=${SETUP_DONE:-0}
# shellcheck source=tests/gpu_sglang/device-setup.sh
source "$H/device-setup.sh" > "$W/logs/setup.log" 2>&1 || { cat "$W/logs/setup.log"; exit 1; }
stamp "setup done; $(python3 -c 'import torch; print(torch.__version__, torch.cuda.device_count(), torch.cuda.get_device_name(0))')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$W/logs/nvidia-smi.csv" 2>&1
df -h /tmp /dev/shm > "$W/logs/df.txt" 2>&1; free -g >> "$W/logs/df.txt" 2>&1  # where a bed can live
# The models of the language SYNTH_LANG (synth_lang.py): `models` for the default one, `models-KIND` else.
LANG_DIR=models; [ "${SYNTH_LANG:-phrases}" = phrases ] || LANG_DIR=models-$SYNTH_LANG
MODELS=$REPO/.cache/gpu-sglang/$LANG_DIR; [ -d "$MODELS" ] || MODELS=$W/$LANG_DIR
for tgz in "$REPO/docs/evidence/gpu-sglang/$LANG_DIR.tgz" "$REPO/.cache/gpu-sglang/$LANG_DIR.tgz"; do
  if [ ! -d "$MODELS" ] && [ -f "$tgz" ]; then tar xzf "$tgz" -C "$W"; MODELS=$W/$LANG_DIR; fi
done
# Drafters kept with the evidence (docs/evidence/gpu-sglang/drafters/NAME.tgz, tracked) or beside the carry
# (.cache/gpu-sglang/drafters/NAME.tgz, e.g. a `weak` step's weak-drafter.tgz) join MODELS, so a later call
# needs no training.
if [ "$MODELS" = "$W/$LANG_DIR" ] && [ "$LANG_DIR" = models ]; then
  for tgz in "$REPO"/docs/evidence/gpu-sglang/drafters/*.tgz "$REPO"/.cache/gpu-sglang/drafters/*.tgz; do
    [ -f "$tgz" ] && tar xzf "$tgz" -C "$MODELS"
  done
fi
# The embedded test bed's drafters besides the trained tiny-qwen3-dflash (in-server acceptance ~12): levels
# saved by one training run when its offline acceptance first reaches each threshold (in server: ~3-4, ~6-7);
# `none`: no levels, the bed holds the trained drafter alone (nothing to train).
# Real text (code, prose): three levels, offline 3.2 / 6.0 / 9.0 for in-server ~2-3, ~4-5, ~6-7 (how offline and
# in-server acceptance relate differs by language: README.md, "Real-text languages"); the levels train for longer
# (TRAIN_LIMIT_S, default 420 s with the target, 300 s without; the target stops early on held-out loss), at 256
# sequences a step (DRAFTER_BATCH) on 6 x 4096 greedy continuations (DRAFTER_DATA: a drafter that sees the same
# few continuations for many epochs can stop gaining held-out acceptance).
CORPUS=0
case ${SYNTH_LANG:-phrases} in
  code|prose) CORPUS=1; export DRAFTER_BATCH=${DRAFTER_BATCH:-256} DRAFTER_DATA=${DRAFTER_DATA:-4096}
    EMBED_LEVELS=${EMBED_LEVELS:-tiny-$SYNTH_LANG-dflash-low:3.2,tiny-$SYNTH_LANG-dflash-mid:6.0,tiny-$SYNTH_LANG-dflash-high:9.0} ;;
esac
EMBED_LEVELS=${EMBED_LEVELS:-tiny-qwen3-dflash-low:4.8,tiny-qwen3-dflash-mid:8.2}
level_names() { [ "$EMBED_LEVELS" = none ] && return 0; echo "$EMBED_LEVELS" | tr ',' '\n' | sed 's/:[^:]*$//'; }
train_levels() {  # the drafter levels MODELS lacks, from one training run (the target too when MODELS has none)
  local missing=0 name target=1 carried=$REPO/.cache/gpu-sglang/$LANG_DIR.carry.tar.xz
  [ -f "$carried" ] || carried=$REPO/docs/evidence/gpu-sglang/$LANG_DIR.carry.tar.xz  # one kept with the evidence
  # Real text: an earlier call's models (carry_models.py: the snapped target, the levels it reached and the
  # last drafter) join MODELS; the levels still missing train on, from that drafter.
  if [ "$CORPUS" = 1 ] && [ -f "$carried" ] && [ ! -f "$MODELS/tiny-qwen3/config.json" ]; then
    python3 "$H/carry_models.py" unpack "$carried" "$MODELS" > "$W/logs/carry-unpack.json"
  fi
  for name in $(level_names); do [ -f "$MODELS/$name/config.json" ] || missing=1; done
  [ "$missing" = 1 ] || return 0
  [ -f "$MODELS/tiny-qwen3/config.json" ] || target=0
  local limit_s=$(( target ? 240 : 330 )) train_s=${TRAIN_LIMIT_S:-}
  if [ "$CORPUS" = 1 ]; then  # real text: longer, inside what is left of the call
    train_s=${train_s:-$(( target ? 300 : 420 ))}; limit_s=$(( train_s + 45 ))
    [ "$limit_s" -le "$(left)" ] || limit_s=$(left)
  fi
  local resume=; [ "$CORPUS" = 1 ] && [ -f "$MODELS/drafter-last/config.json" ] && resume=$MODELS/drafter-last
  TRAIN_CARRY=$CORPUS DRAFTER_RESUME=$resume TRAIN_LIMIT_S=${train_s:-200} timeout "$limit_s" \
    python3 "$H/train_models.py" "$MODELS" --drafter-levels "$EMBED_LEVELS" 2>&1 \
    | tr '\r' '\n' | tee "$W/logs/train-levels.log" | grep -E "level|acceptance|budget|target: |resumed" | tail -40
  cp "$MODELS/train-levels.json" "$W/logs/" 2>/dev/null
  if [ "$CORPUS" = 1 ]; then  # everything a later call carries on from, packed (.cache/gpu-sglang/LANG_DIR.carry.tar.xz)
    python3 "$H/carry_models.py" pack "$MODELS" "$OUT/$LANG_DIR.carry.tar.xz" > "$W/logs/carry-pack.json"
  elif [ "$target" = 1 ]; then
    # shellcheck disable=SC2046
    tar czf "$OUT/drafter-levels.tgz" -C "$MODELS" $(level_names)
  else  # a new target: the whole models directory, for a later call to carry (.cache/gpu-sglang/LANG_DIR.tgz)
    tar czf "$OUT/$LANG_DIR.tgz" -C "$(dirname "$MODELS")" "$(basename "$MODELS")"
  fi
}
embed_bed() {  # SHAPE: the levels, then the tiny target and every drafter embedded into $W/embedded-SHAPE
  local shape=$1 layers=${EMBED_LAYERS:-} root=${EMBED_ROOT:-$W} args=() name old bed=$W/embedded-$1
  # The 30B-A3B's 48 layers outgrow the device's disk beside the rest, so 24 unless EMBED_LAYERS says
  # otherwise; EMBED_ROOT=/dev/shm (memory-backed, larger than the disk there) holds all 48.
  [ "$shape" = qwen3-30b-a3b ] && layers=${layers:-24}
  train_levels
  [ -f "$MODELS/tiny-qwen3-dflash/config.json" ] && args+=(--drafter tiny-qwen3-dflash)  # absent: levels only
  for name in $(level_names); do args+=(--drafter "$name"); done
  if [ -n "${DFLASH2:-}" ]; then train_dflash2 missing; args+=(--drafter "$DFLASH2_NAME"); fi
  [ -n "$layers" ] && args+=(--layers "$layers")
  # One bed at a time; embed_models.py --reuse keeps a bed made the same way. A bed under EMBED_ROOT is
  # reached through the link $W/embedded-SHAPE, the path the servers read.
  for old in "$W"/embedded-*; do [ "$old" = "$bed" ] || rm -rf "$(readlink -f "$old")" "$old"; done
  if [ "$root" != "$W" ]; then
    [ -L "$bed" ] || rm -rf "$bed"
    mkdir -p "$root/embedded-$shape" && ln -sfn "$root/embedded-$shape" "$bed"
  elif [ -L "$bed" ]; then
    rm -rf "$(readlink -f "$bed")" "$bed"
  fi
  [ -n "${EMBED_VERIFY:-}" ] && args+=(--verify)
  timeout "$(left)" python3 "$H/embed_models.py" "$MODELS" "$bed" --shape "$shape" --reuse "${args[@]}" \
    2>&1 | tee "$W/logs/embed-$shape.log" | tail -8
  cp "$bed/embed.json" "$W/logs/embed-$shape.json" 2>/dev/null
}
DFLASH2_NAME=${DFLASH2_NAME:-tiny-qwen3-dflash2}
train_dflash2() {  # [missing]: the DFlash2 drafter for MODELS' target (with `missing`, only when MODELS lacks it)
  [ "${1:-}" = missing ] && [ -f "$MODELS/$DFLASH2_NAME/config.json" ] && return 0
  local target=1 limit_s
  [ -f "$MODELS/tiny-qwen3/config.json" ] || target=0
  limit_s=$(( target ? 240 : 330 )); [ "$limit_s" -le "$(left)" ] || limit_s=$(left)
  # TRAIN_LIMIT_S: the training loop's share; the offline report after it (16 held-out prompts: the path, the
  # chain, three trees; 64 for the chain) takes the rest of limit_s
  TRAIN_LIMIT_S=${TRAIN_LIMIT_S:-180} timeout "$limit_s" python3 "$H/train_models.py" "$MODELS" \
    --dflash2 "$DFLASH2_NAME${DFLASH2_ACCEPT:+:$DFLASH2_ACCEPT}" 2>&1 \
    | tr '\r' '\n' | tee "$W/logs/train-dflash2.log" | grep -E "DFlash2|acceptance|budget|target: " | tail -20
  cp "$MODELS/train-$DFLASH2_NAME.json" "$W/logs/" 2>/dev/null
  if [ "$target" = 1 ]; then
    tar czf "$OUT/dflash2-drafter.tgz" -C "$MODELS" "$DFLASH2_NAME"
  else  # a new target: the whole models directory, for a later call to carry (.cache/gpu-sglang/LANG_DIR.tgz)
    tar czf "$OUT/$LANG_DIR.tgz" -C "$(dirname "$MODELS")" "$(basename "$MODELS")"
  fi
}
target_models() {  # TARGET: the models directory its servers read, made when missing (a shaped or embedded bed)
  local target=$1 dir
  dir=$(python3 "$H/models_for_target.py" "$target" "$MODELS" "$W") || return 1
  if [ "$dir" = "$W/shaped" ]; then
    python3 "$H/make_shaped.py" "$W/shaped" > "$W/logs/make-shaped.log" 2>&1 || { cat "$W/logs/make-shaped.log" >&2; return 1; }
  fi
  case $target in  # the bed of MODELS: kept when it holds them (embed_models.py --reuse)
    embedded-*) embed_bed "${target#embedded-}" >&2 ;;
  esac
  echo "$dir"
}
for step in "$@"; do
  stamp "step $step"
  case $step in
    train) timeout 270 python3 "$H/train_models.py" "$W/$LANG_DIR" 2>&1 | tr '\r' '\n' | tee "$W/logs/train.log"
           MODELS=$W/$LANG_DIR; cp "$MODELS/train.json" "$OUT/" 2>/dev/null
           tar czf "$OUT/$LANG_DIR.tgz" --exclude train.json -C "$W" "$LANG_DIR" ;;
    weak) timeout 200 python3 "$H/train_models.py" "$MODELS" --drafter-only tiny-qwen3-dflash-weak "${WEAK_ACCEPT:-5}" 2>&1 \
            | tr '\r' '\n' | tee "$W/logs/train-weak.log" | tail -12
          cp "$MODELS"/train-tiny-qwen3-dflash-weak.json "$W/logs/" 2>/dev/null
          tar czf "$OUT/weak-drafter.tgz" -C "$MODELS" tiny-qwen3-dflash-weak ;;
    autotune) tune_models=$(target_models "${AUTOTUNE_TARGET:-tiny}") || continue
          for drafter in ${AUTOTUNE_DRAFTERS:-tiny-qwen3-dflash}; do
            timeout "$(left)" python3 "$H/autotune_real.py" "$W/logs" "$tune_models" "$drafter" "${AUTOTUNE_ROUNDS:-3}" 2>&1 | tail -30
          done ;;
    tp1|sampled|tp2) timeout "$(left)" python3 "$H/scenario.py" "$W/logs" "$MODELS" "$step" 2>&1 | tail -20 ;;
    topk) PYTHONPATH=$REPO/sglang_overlay/src timeout 240 python3 "$REPO/sglang_overlay/benchmarks/draft_topk.py" \
            --json "$W/logs/results-topk.json" 2>&1 | tee "$W/logs/topk.log" | tail -20 ;;
    attn) read -r -a attn_args <<< "${ATTN_ARGS:-}"  # the benchmark's options, split on spaces
          PYTHONPATH=$REPO/sglang_overlay/src TRITON_INTERPRET=0 timeout 200 python3 \
            "$REPO/sglang_overlay/benchmarks/tree_attention.py" --json "$W/logs/results-attn.json" "${attn_args[@]}" 2>&1 \
            | tee "$W/logs/attn.log" | tail -20 ;;
    stage) TRITON_INTERPRET=0 timeout 150 python3 "$REPO/sglang_overlay/tests/adapter/gpu_stage_check.py" \
            > "$W/logs/results-stage.json" 2> "$W/logs/stage.log"; echo "stage rc $?"
           tail -25 "$W/logs/results-stage.json"; tail -5 "$W/logs/stage.log" ;;
    embed) embed_bed "${EMBED_SHAPE:-qwen3-8b}" ;;
    dflash2) train_dflash2 ;;
    perf|profile) [ "$step" = profile ] && export PERF_TARGET=${PERF_TARGET:-qwen3-8b}
          perf_models=$(target_models "${PERF_TARGET:-tiny}") || continue
          if [ "$step" = profile ]; then
            timeout "$(left)" python3 "$H/profile_step.py" "$W/logs" "$perf_models" 2>&1 | tail -80
          elif [[ "${PERF_DRAFTER:-}" == *,* ]]; then  # one perf run per drafter level, each its own file
            for drafter in ${PERF_DRAFTER//,/ }; do
              [ "$(left)" -gt 120 ] || { echo "no time left for perf with $drafter"; break; }
              PERF_DRAFTER=$drafter timeout "$(left)" python3 "$H/perf.py" "$W/logs" "$perf_models" "${PERF_ROUNDS:-3}" \
                2>&1 | tail -40
              mv "$W/logs/results-perf.json" "$W/logs/results-perf-$drafter.json" 2>/dev/null
              mkdir -p "$W/logs/$drafter" && mv "$W"/logs/server-perf-*.log "$W/logs/$drafter/" 2>/dev/null
            done
          else
            timeout "$(left)" python3 "$H/perf.py" "$W/logs" "$perf_models" "${PERF_ROUNDS:-3}" 2>&1 | tail -60
          fi ;;
    plant) plant_models=$(target_models "${PERF_TARGET:-qwen3-8b}") || continue
          PERF_TARGET=${PERF_TARGET:-qwen3-8b} timeout "$(left)" python3 "$H/plant_bench.py" "$W/logs" "$plant_models" 2>&1 \
            | tail -80 ;;
    checks) timeout "${CHECKS_LIMIT:-540}" python3 "$H/device_checks.py" "$W/logs" "$MODELS" 2>&1 | tail -20 ;;
    hybrid) MODELS_HYBRID=$REPO/.cache/gpu-sglang/models-hybrid; [ -d "$MODELS_HYBRID" ] || MODELS_HYBRID=$W/models-hybrid
          for tgz in "$REPO/docs/evidence/gpu-sglang/models-hybrid.tgz" "$REPO/.cache/gpu-sglang/models-hybrid.tgz"; do
            [ ! -d "$MODELS_HYBRID" ] && [ -f "$tgz" ] && tar xzf "$tgz" -C "$W" && MODELS_HYBRID=$W/models-hybrid
          done
          if [ ! -f "$MODELS_HYBRID/tiny-hybrid-dflash/config.json" ]; then  # the drafter stops by HYBRID_TRAIN_LIMIT_S (170)
            HF_HUB_OFFLINE=1 timeout 240 python3 "$H/train_hybrid.py" "$MODELS_HYBRID" 2>&1 | tr '\r' '\n' \
              | tee "$W/logs/train-hybrid.log" | grep -E "target|drafter|continuations" | tail -30
            cp "$MODELS_HYBRID/train-hybrid.json" "$W/logs/" 2>/dev/null
            tar czf "$OUT/models-hybrid.tgz" -C "$(dirname "$MODELS_HYBRID")" "$(basename "$MODELS_HYBRID")"
          fi
          SCENARIO_PREFILL_GRAPHS=${SCENARIO_PREFILL_GRAPHS:-0} HF_HUB_OFFLINE=1 timeout "$(left)" \
            python3 "$H/hybrid_check.py" "$W/logs" "$MODELS_HYBRID" 2>&1 | tail -40 ;;
    traffic) timeout "$(left)" python3 "$H/traffic.py" "$W/logs" "$MODELS" 2>&1 | tail -40 ;;  # radix, chunked, mixed, stream, abort
    *) echo "unknown step $step" ;;
  esac
done
stamp "packing"
cp "$W"/logs/results-*.json "$W"/logs/train-*.json "$W/logs/checks.json" "$OUT/" 2>/dev/null
tar czf "$OUT/logs.tgz" --exclude logs/prof -C "$W" logs  # traces stay: results-profile.json sums them
python3 "$H/analyze.py" --device-summary "$W/logs" 2>&1 | tail -40
stamp "done"; ls -la "$OUT"
