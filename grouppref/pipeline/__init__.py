"""The data stages of a run, one package each: config (light settings) and stage (the run)."""
