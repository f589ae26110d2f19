"""Root conftest: intentionally thin. The plugin registers itself via its pytest11 entry point."""
