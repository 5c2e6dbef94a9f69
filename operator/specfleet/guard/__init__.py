"""The guard: pure policy from per-class observations to kill-switch and rollback decisions."""

from specfleet.guard.decide import Action, Decision, Situation, decide
from specfleet.guard.policy import Policy

__all__ = ["Action", "Decision", "Policy", "Situation", "decide"]
