"""Nearshore: the CLI, config loading and the shared wire protocol that edge and region speak."""

__version__ = "0.1.0"
