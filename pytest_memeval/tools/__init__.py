"""After the run, in two roles: the pytest plugins that finish every session (``gate/plugin.py``,
``report/plugin.py``, ``publish/``) and the ``memeval`` command (``cli.py``) with its
subcommands, one folder or module each (``compare/``, ``report/``, ``slurm/``, ``gpu_check/``,
``merge.py``, ...). In a folder, ``plugin.py`` is a pytest plugin, ``command.py`` a subcommand,
and ``__init__.py`` the package's public names. See docs/architecture.md."""
