"""The ``generate`` stage."""
