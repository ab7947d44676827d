"""Plant a lossy walk into a copy of the overlay's worker.py (the chi-square test's control release).

The planted bug: the tree walk of a sampled request follows the target's argmax instead of sampling
from the target's distribution (SGLang's greedy tree verify is used for every batch). Greedy requests
are unaffected, sampled ones lose their randomness on every token produced through speculation, so
the control release must fail the same chi-square test that the real release passes.
Usage: python plant_lossy_walk.py PATH/TO/COPY/worker.py (never run on the project's own sources).
"""

import sys

ANCHOR = """        predict, accept_lens, accept_index = eagle_sample(
            batch.spec_info,
            batch,
            verified.logits_output,
            grammar_mask,
            watermark_state=self.model_runner.watermark_state,
        )
"""
PLANTED = """        # PLANTED LOSSY WALK (control release of tests/gpu_sglang): sampled requests walk the argmax.
        saved_greedy = batch.sampling_info.is_all_greedy
        batch.sampling_info.is_all_greedy = True
        try:
            predict, accept_lens, accept_index = eagle_sample(
                batch.spec_info,
                batch,
                verified.logits_output,
                grammar_mask,
                watermark_state=self.model_runner.watermark_state,
            )
        finally:
            batch.sampling_info.is_all_greedy = saved_greedy
"""


def main(path):
    if "/work/main/sglang_overlay/" in path or "tests/gpu_sglang" in path:
        raise SystemExit("refusing to patch the project's own sources: " + path)
    with open(path) as f:
        text = f.read()
    if text.count(ANCHOR) != 1:
        raise SystemExit("plant_lossy_walk: the eagle_sample call in %s is not where expected" % path)
    with open(path, "w") as f:
        f.write(text.replace(ANCHOR, PLANTED))
    print("planted lossy walk into", path)


if __name__ == "__main__":
    main(sys.argv[1])
