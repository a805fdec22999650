"""Refresh rounds during a policy training: groups sampled from the current policy, ranked and
aggregated by the pipeline's own code, kept in a buffer and mixed into the batches."""
