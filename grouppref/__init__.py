"""grouppref: group-wise preference data and training.

Generate K candidates per prompt, rank them (automatic rankers and humans in Argilla),
aggregate the rankings with Bradley-Terry / Plackett-Luce, validate and export group
datasets, and train with GSPO (Groupwise Supervised Preference Optimization, an offline
group-wise preference loss).
"""

__version__ = "0.1.0"
