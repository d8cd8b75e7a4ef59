"""The ``tuner`` command: one module per command group, each only parses and delegates."""
