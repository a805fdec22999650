"""The ground floor of a run: the store (stage folders, manifests, shards, rejects),
hashing, progress bars and the Stage contract."""
