"""tasknet.upstream."""
