"""Packaged embedding configs: ``adult.yaml`` (the demo) and ``default.yaml``."""
