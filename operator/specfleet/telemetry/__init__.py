"""Telemetry: Prometheus → per (SpecModel, class, window) observations for the guard."""
