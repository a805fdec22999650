"""The training objective: group preference losses as pure functions over rewards ``s`` (B, K),
and the one dispatch from a loss name to its function."""
