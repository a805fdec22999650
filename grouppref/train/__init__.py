"""Training: GSPO (Groupwise Supervised Preference Optimization: offline, no critic, no
sampling) and its baselines for a policy, a scalar reward model, and their evaluation.

Sub-packages, each importing only those listed before it (tests/integration/test_architecture.py checks it):

* :mod:`~grouppref.train.settings`: every setting, torch-free (the CLI and the run config read
  them); the fields both trainers share are declared once (``settings/shared.py``);
* :mod:`~grouppref.train.tensors`: the tokenised group and its tensor batch, prefix-shared
  log-probs (packing, taken-token log-probs);
* :mod:`~grouppref.train.objective`: the losses, pure functions over rewards, and the one
  dispatch from a loss name to its function;
* :mod:`~grouppref.train.engine`: what both trainers run alike (the accelerate loop,
  checkpoints, processes, metric sums, the model folder);
* :mod:`~grouppref.train.data`: groups -> tokens, reference log-probs, where training data comes
  from;
* :mod:`~grouppref.train.eval`: preference metrics and the ``eval`` stage;
* :mod:`~grouppref.train.refresh`: groups sampled from the current policy during training;
* :mod:`~grouppref.train.reward_model`: the ``train_rm`` stage;
* :mod:`~grouppref.train.policy`: the ``train`` stage.
"""
