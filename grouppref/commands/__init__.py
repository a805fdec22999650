"""CLI subcommands, one module per area; each module has ``register(app)``."""
