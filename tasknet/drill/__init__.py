"""tasknet.drill."""
