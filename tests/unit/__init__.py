"""Focused tests of one module or function each: no pytest subprocess, no model run."""
