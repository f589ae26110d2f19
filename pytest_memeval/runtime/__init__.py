"""The pytest run: session state built at configure, the worker (decodes and scores its
scenarios), the controller (aggregates across xdist workers, journals, finishes the run), the
scheduler, device binding, start-up, resume, progress and terminal output. Plain data crosses
processes; everything here sits on ``core``, ``model`` and ``decode``."""
