"""The job queue: a pure placement policy first; storage and the daemon build on it."""
