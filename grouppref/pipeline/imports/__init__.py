"""The ``imports`` stage."""
