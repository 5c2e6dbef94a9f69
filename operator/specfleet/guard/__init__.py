"""The guard: pure policy from per-class observations to kill-switch and rollback decisions."""

from specfleet.guard.actions import Action
from specfleet.guard.decide import Decision, decide
from specfleet.guard.policy import Policy
from specfleet.guard.situation import Situation

__all__ = ["Action", "Decision", "Policy", "Situation", "decide"]
