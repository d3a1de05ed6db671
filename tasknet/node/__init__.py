"""tasknet.node."""
