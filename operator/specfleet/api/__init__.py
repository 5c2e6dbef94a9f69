"""specfleet.api."""
