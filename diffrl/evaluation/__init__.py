"""Evaluation: sample the eval prompts with fixed seeds, score them, and draw what a run's evals show (grids, media files, the report page)."""
