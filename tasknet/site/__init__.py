"""tasknet.site."""
