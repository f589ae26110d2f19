"""The plugin's own tests."""
