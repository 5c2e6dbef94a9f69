"""specfleet.guard."""
