"""The ``prompts`` stage."""
