"""Human labeling in Argilla: dataset settings, push, pull, status, and an embedded server."""
