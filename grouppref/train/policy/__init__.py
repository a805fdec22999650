"""The policy's training: the ``train`` stage (``grouppref train``), its step, set-up, loop, label-
source mix and model card."""
