"""The ``export`` stage."""
