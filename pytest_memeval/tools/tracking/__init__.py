"""Experiment trackers: a finished run logged where a team compares checkpoints over weeks.

Each tracker is a ``pytest_memeval_run_finished`` implementation registered only when asked
for (``--memeval-mlflow URI``: :mod:`.mlflow`). What a run is to a tracker (parameters,
metrics, tags, artifacts) is decided once, tracker-neutrally, in :mod:`.fields`.
"""
