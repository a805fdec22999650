"""Tensor code of a training step: the tokenised group and its padded batch, and per-candidate
log-probs with the prompt computed once per group (packing, taken-token log-probs)."""
