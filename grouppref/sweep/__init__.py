"""``grouppref sweep``: the group-size and recipe ablation on a team's own data (docs/sweep.md).

:mod:`.subsample` restricts groups to k candidates, :mod:`.config` holds the settings and the
search space syntax, :mod:`.engine` runs the trials on Optuna through :func:`grouppref.train.
trainer.train`, :mod:`.summary` turns a study into the table, plots and ``best.yaml``.
"""
