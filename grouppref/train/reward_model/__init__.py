"""A scalar reward model trained on ranked groups: the ``train_rm`` stage (``grouppref train-rm``)."""
