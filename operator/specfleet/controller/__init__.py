"""specfleet.controller."""
