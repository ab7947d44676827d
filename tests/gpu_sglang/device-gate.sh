#!/usr/bin/env bash
# On the device (through the device tool's `run`): the health gate against real SGLang servers and the
# conformance recording (tests/gpu_sglang/gate_real.py). Everything lands in $OUT: gate.tgz (the results,
# the baseline and metrics files, the conformance fixtures, the servers' logs).
# carry: .cache/gpu-sglang/{wheels,flashinfer-headers.tgz,overlay,control} (models: docs/evidence's models.tgz).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd); H=$REPO/tests/gpu_sglang
W=/tmp/gs; mkdir -p "$W/logs" "$W/gate"; OUT=${OUT:-$W/out}; mkdir -p "$OUT"
t0=$(date +%s); stamp() { echo "[device-gate +$(( $(date +%s) - t0 ))s] $*"; }
if [ -d /tmp/site/sglang ]; then SETUP_DONE=1; fi
export REPO SETUP_DONE=${SETUP_DONE:-0}
stamp setup
# shellcheck source=tests/gpu_sglang/device-setup.sh
source "$H/device-setup.sh" > "$W/logs/setup.log" 2>&1 || { cat "$W/logs/setup.log"; exit 1; }
MODELS=$REPO/.cache/gpu-sglang/models; [ -d "$MODELS" ] || MODELS=$W/models
if [ ! -d "$MODELS" ]; then tar xzf "$REPO/docs/evidence/gpu-sglang/models.tgz" -C "$W"; MODELS=$W/models; fi
stamp "setup done; gate_real"
GATE_LIMIT=$(( ${CALL_LIMIT:-530} - $(date +%s) + t0 - 25 )) timeout $(( ${CALL_LIMIT:-530} - $(date +%s) + t0 - 15 )) \
  python3 "$H/gate_real.py" "$W/gate" "$MODELS" 2>&1 | tail -40
stamp packing
tar czf "$OUT/gate.tgz" -C "$W" gate
python3 - "$W/gate/gate-results.json" <<'PY' 2>&1 | tail -30
import json, sys
d = json.load(open(sys.argv[1]))
for k, v in sorted(d.items()):
    if isinstance(v, dict) and "passed" in v:
        r = v.get("result") or {}
        print(k, v["passed"], r.get("failed_stage"), r.get("failure_kind"), (v.get("message") or "")[:300])
PY
stamp "done"; ls -la "$OUT"
