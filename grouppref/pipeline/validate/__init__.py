"""The ``validate`` stage."""
