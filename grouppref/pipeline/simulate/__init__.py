"""The ``simulate`` stage."""
