"""Reference DDTree decoding for Hugging Face causal LMs (no sglang).

    decoder  generate_ddtree, generate_ar, tree_attention_mask_4d, compact_kv_cache
    toy      tiny_causal_lm, NoisyTargetDrafter, ModelDrafter
    hybrid   HybridLM (attention + GDN / Mamba2 layers), tree_verify / commit, generate_hybrid_ddtree

Needs torch and transformers.
"""
