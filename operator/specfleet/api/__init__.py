"""The SpecModel API: pydantic models of spec and status, the CRD generated from them, and the
validation `specfleet render`, the operator and admission share."""

from specfleet.api.base import API_VERSION, GROUP, KIND, PLURAL, VERSION
from specfleet.api.model import (
    CLASSES_OFF_ANNOTATION,
    KILL_SWITCH_ANNOTATION,
    RETRY_ANNOTATION,
    ROLLOUT_ANNOTATION,
    EngineConfig,
    ObjectMeta,
    SpecModel,
)
from specfleet.api.spec import Engine, GuardMode, SpecModelSpec, SpeculativeMethod
from specfleet.api.status import Condition, ConditionType, Decision, Phase, SpecModelStatus
from specfleet.api.validation import FieldError, InvalidSpecModel, parse_specmodel

__all__ = [
    "API_VERSION",
    "CLASSES_OFF_ANNOTATION",
    "GROUP",
    "KILL_SWITCH_ANNOTATION",
    "KIND",
    "PLURAL",
    "RETRY_ANNOTATION",
    "ROLLOUT_ANNOTATION",
    "VERSION",
    "Condition",
    "ConditionType",
    "Decision",
    "Engine",
    "EngineConfig",
    "FieldError",
    "GuardMode",
    "InvalidSpecModel",
    "ObjectMeta",
    "Phase",
    "SpecModel",
    "SpecModelSpec",
    "SpecModelStatus",
    "SpeculativeMethod",
    "parse_specmodel",
]
