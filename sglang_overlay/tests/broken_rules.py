"""Deliberately wrong verification rules, used as controls: a distribution test must reject them."""

from __future__ import annotations

import torch

from sglang_overlay.core.walk import sample_target_tokens, walk_tree


def accept_drafter_token(tree, logits, temperature, gen):
    """BROKEN: accept the drafter's top (rank-0) child wherever there is one; sample only the bonus."""
    sampled = sample_target_tokens(logits, temperature, gen)
    is_node = tree.slot_is_node()
    top_child = torch.full_like(sampled, -1)
    for i in range(1, tree.num_slots):  # the rank-0 child's token of each parent slot
        rank0 = is_node[:, i] & (tree.ranks[:, i] == 0)
        p = tree.parents[:, i].long().clamp(min=0)
        top_child[rank0, p[rank0]] = tree.tokens[rank0, i]
    return walk_tree(tree, torch.where(top_child >= 0, top_child, sampled))
