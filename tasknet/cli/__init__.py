"""tasknet.cli."""
