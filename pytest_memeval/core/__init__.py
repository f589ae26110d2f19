"""Plain-data core: scenario records, matching, scoring, metrics, statistics, recount, and the
run directory on disk. Pure Python: nothing here imports torch or transformers, and nothing
here imports another folder of the package (only :mod:`pytest_memeval.compat`)."""
