"""After the run: compare, gate and expected failures, merge of shards, HTML reports, the
benchmark of the decoders, Slurm submission, and the ``memeval`` command that fronts them."""
