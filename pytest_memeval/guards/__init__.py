"""Byte guards: the model-free checks that the prompts the harness builds are byte-identical
to the training-format data (checks), their syrupy snapshot extensions (snapshot), and the
parametrized guard items with their hooks (items)."""
