"""tasknet.site.storage."""
