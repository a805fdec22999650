"""The ``aggregate`` stage."""
