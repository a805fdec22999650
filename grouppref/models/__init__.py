"""Models: loading (Hub id, local path, embedded SmolLM2) and seeded sampling."""
