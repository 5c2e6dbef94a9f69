"""specfleet.telemetry."""
