"""Reading user files (JSONL/JSON/CSV/Parquet, saved datasets, Hub ids) into rows and
records, with rejects."""
