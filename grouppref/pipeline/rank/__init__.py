"""The ``rank`` stage."""
