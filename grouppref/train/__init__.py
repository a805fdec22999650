"""GSPO training: Groupwise Supervised Preference Optimization (offline, no critic, no sampling).

Modules: :mod:`~grouppref.train.data` (tokenise and batch groups), :mod:`~grouppref.train.logps`
(prefix-shared per-candidate log-probs), :mod:`~grouppref.train.losses` (pure losses).
"""
