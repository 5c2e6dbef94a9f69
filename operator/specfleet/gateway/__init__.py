"""specfleet.gateway."""
