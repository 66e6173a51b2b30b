"""Entry-point scripts (make run, make cluster)."""
