"""Evaluation: preference metrics of a model on tokenised groups (:mod:`.metrics`) and the
``eval`` stage (:mod:`.stage`)."""
