"""The data a training reads: validated groups from a run or a published dataset, tokenised,
with cached reference log-probs; and how a training stage records the groups it used."""
