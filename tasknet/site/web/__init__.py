"""tasknet.site.web."""
