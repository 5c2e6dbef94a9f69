"""specfleet.render."""
