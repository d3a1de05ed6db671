"""tasknet: a main site and storage nodes that agree under failure."""

__version__ = "0.1.0"
