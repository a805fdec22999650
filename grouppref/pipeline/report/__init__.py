"""The ``report`` stage."""
