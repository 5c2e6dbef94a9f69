"""Closed-loop replay of the guard against a simulated fleet (`specfleet simulate`)."""
