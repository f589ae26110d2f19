"""End-to-end tests: pytester or subprocess pytest runs, real model loads, real services."""
