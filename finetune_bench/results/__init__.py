"""What a run produced: its record (status, metrics, environment) and the store that keeps finished runs
so that a re-run of the same grid reuses them."""
