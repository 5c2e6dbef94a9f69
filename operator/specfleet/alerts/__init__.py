"""specfleet.alerts."""
