"""Plant a lossy greedy tree walk into a copy of the overlay's adapter/worker.py (the health gate's control).

The planted bug: before SGLang's tree acceptance runs, every tree node's verify logits are overwritten so
that the target "predicts" the node's first child, i.e. the walk accepts the first child of every node
without comparing it with the target's choice (a walk that trusts the drafter). Greedy outputs then follow
the drafter wherever it disagrees with the target, so a greedy baseline recorded by a lossless release
must catch it (plant_lossy_walk.py's bug touches sampled requests only, which the gate does not send).
Usage: python plant_greedy_lossy_walk.py PATH/TO/COPY/worker.py (never run on the project's own sources).
"""

import sys

ANCHOR = """        predict, accept_lens, accept_index = eagle_sample(
            batch.spec_info,
"""
PLANTED = """        # PLANTED LOSSY GREEDY WALK (control release of tests/gpu_sglang/gate_real.py): each node's
        # first child is made the target's argmax, so the walk accepts it without checking.
        _logits = verified.logits_output.next_token_logits
        _bs, _w = tensors.retrieve_next_token.shape
        _child = tensors.retrieve_next_token.reshape(-1)
        _has = _child >= 0
        _req = torch.arange(_bs, device=_child.device).repeat_interleave(_w)
        _tok = tensors.draft_token.view(_bs, _w)[_req, _child.clamp(min=0)]
        _rows = torch.arange(_bs * _w, device=_child.device)[_has]
        _logits[_rows, _tok[_has]] = _logits.max().detach() + 100.0
        predict, accept_lens, accept_index = eagle_sample(
            batch.spec_info,
"""


def main(path):
    if "/work/main/sglang_overlay/" in path or "tests/gpu_sglang" in path:
        raise SystemExit("refusing to patch the project's own sources: " + path)
    with open(path) as handle:
        text = handle.read()
    if text.count(ANCHOR) != 1:
        raise SystemExit("plant_greedy_lossy_walk: the eagle_sample call in %s is not where expected" % path)
    with open(path, "w") as handle:
        handle.write(text.replace(ANCHOR, PLANTED))
    print("planted lossy greedy walk into", path)


if __name__ == "__main__":
    main(sys.argv[1])
