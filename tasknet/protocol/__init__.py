"""tasknet.protocol."""
