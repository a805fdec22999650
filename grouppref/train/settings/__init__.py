"""Settings of the training stages (``train``, ``eval``, ``train_rm``) and their parts: light (no
torch), so the CLI builds its options from them and a run config validates without loading a
model."""
