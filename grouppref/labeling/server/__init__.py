"""The embedded Argilla server: its own venv, child processes, credentials and the
search-engine plugin."""
