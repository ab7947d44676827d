"""service_plan's main() with DDTREE services and attention backends (docs/decisions/ddtree-attention-backend.md):
the refusal before anything changes, and the flag the plan renders."""

import copy
import json

from conftest import run_module
from service_samples import coder

from ansible_collections.ddtree.sglang.plugins.modules import service_plan

CODER = coder()
DFLASH = {
    "name": "chat",
    "model_path": "/models/chat",
    "draft_model_path": "/models/chat-dflash",
    "gpus": [2],
    "port": 30001,
    "speculative": {"algorithm": "DFLASH"},
    "extra_args": ["--attention-backend", "flashinfer"],
}
EIGHT = list(range(8))


def test_service_plan_refuses_flashinfer_for_ddtree_before_anything_changes(capsys):
    code, result = run_module(
        service_plan,
        {
            "services": [dict(copy.deepcopy(CODER), extra_args=["--attention-backend", "flashinfer"])],
            "gpu_indices": EIGHT,
            "host": "ct200",
        },
        capsys,
    )
    assert code == 1 and result["failed"]
    assert result["msg"] == (
        "1 problem(s) in sglang_services, nothing was changed: ct200: sglang_services[0] (coder): "
        "--attention-backend flashinfer is not proven with DDTREE's tree mask; use triton (or drop the "
        "flag: the collection sets --attention-backend triton for DDTREE) or run the service with DFLASH"
    )


def test_service_plan_renders_triton_for_ddtree_and_leaves_dflash_as_declared(capsys):
    code, result = run_module(
        service_plan, {"services": [CODER, DFLASH], "gpu_indices": EIGHT, "host": "ct200"}, capsys
    )
    assert code == 0, result
    ddtree_plan, dflash_plan = result["services"]
    assert ddtree_plan["exec_args"].endswith("--speculative-ddtree-top-k 8 --attention-backend triton")
    assert dflash_plan["exec_args"].endswith(
        "--speculative-draft-model-path /models/chat-dflash --attention-backend flashinfer"
    )


def test_a_service_the_guard_switched_is_planned_as_dflash_until_its_declaration_changes(capsys, tmp_path):
    (tmp_path / "coder").mkdir()
    state = {
        "fallback": {
            "at": "2026-12-04T18:08:18Z",
            "from": {"algorithm": "DDTREE", "release_id": "d6a644076d2a", "speculative": CODER["speculative"]},
            "to": {"algorithm": "DFLASH"},
            "reason": "acceptance length 1.06 collapsed",
        }
    }
    (tmp_path / "coder" / "guard.json").write_text(json.dumps(state))
    args = {"services": [CODER, DFLASH], "gpu_indices": EIGHT, "host": "ct200", "state_root": str(tmp_path)}
    code, result = run_module(service_plan, copy.deepcopy(args), capsys)
    assert code == 0, result
    assert list(result["guarded"]) == ["coder"] and "acceptance length 1.06 collapsed" in result["guarded"]["coder"]
    coder_plan = result["services"][0]
    assert "--speculative-algorithm DFLASH" in coder_plan["exec_args"] and "ddtree" not in coder_plan["exec_args"]
    assert "stays on DFLASH" in json.dumps(result["warnings"])
    # A new budget: DDTREE again, as declared.
    args["services"] = [dict(CODER, speculative={"algorithm": "DDTREE", "budget": 31, "top_k": 8}), DFLASH]
    code, result = run_module(service_plan, copy.deepcopy(args), capsys)
    assert code == 0 and result["guarded"] == {}
    assert "--speculative-ddtree-budget 31" in result["services"][0]["exec_args"]
    # Without state_root every service runs as declared.
    del args["state_root"]
    code, result = run_module(service_plan, copy.deepcopy(args), capsys)
    assert code == 0 and result["guarded"] == {}
