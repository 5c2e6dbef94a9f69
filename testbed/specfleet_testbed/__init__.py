"""Fakes specfleet is tested against, kept out of the operator image (see README.md)."""
