"""The engine's parameters from the settings' engine sections (``memstream/settings.py``).

The science's knobs are the engine's own frozen dataclasses in ``memstream/memory/``; an
engine section's field is declared None (= the engine's default) and ``engine_params``
builds the dataclass from the fields that are set. Here, below the stages, so that each
stage builds its engine's parameters from the settings itself.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from memstream.memory.clustering import ClusterParams
from memstream.memory.links import LinkParams
from memstream.memory.recurrence import RecurrenceParams
from memstream.memory.strength import StrengthParams
from memstream.settings import (
    ClusterSettings,
    ConsolidationSettings,
    MaintenanceSettings,
    RecurrenceSettings,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

P = TypeVar("P", bound="DataclassInstance")
S = TypeVar("S", bound=BaseModel)


def engine_fields(section: type[BaseModel]) -> list[str]:
    """The fields of an engine section: those declared ``None`` (= the engine's default)."""
    return [name for name, f in section.model_fields.items() if f.default is None]


def engine_params(params: type[P], section: BaseModel, **renamed: str) -> P:
    """``params`` with what ``section`` sets; ``renamed`` maps a params field to the section's
    name for it. An engine field the type lacks is an error, not a setting silently dropped."""
    name_in_section = {f.name: renamed.get(f.name, f.name) for f in dataclasses.fields(params)}
    by_section = {v: k for k, v in name_in_section.items()}
    if stray := sorted(set(engine_fields(type(section))) - set(by_section)):
        raise TypeError(f"{type(section).__name__}: {params.__name__} has no field for {stray}")
    values: dict[str, Any] = {
        by_section[name]: value
        for name in engine_fields(type(section))
        if (value := getattr(section, name)) is not None
    }
    return params(**values)


def written_out(section: S, params: DataclassInstance) -> S:
    """``section`` with each engine field left None set to the engine's value (a rebuilt
    generation records what built it, whatever a later version's defaults are)."""
    unset = [n for n in engine_fields(type(section)) if getattr(section, n) is None]
    values = section.model_dump() | {n: getattr(params, n) for n in unset}
    return type(section).model_validate(values)  # validated: the engine's type may be wider


def cluster_params(c: ClusterSettings) -> ClusterParams:
    return engine_params(ClusterParams, c)


def recurrence_params(r: RecurrenceSettings) -> RecurrenceParams:
    return engine_params(RecurrenceParams, r)


def link_params(c: ConsolidationSettings) -> LinkParams:
    return engine_params(LinkParams, c, similarity="link_similarity")


def strength_params(m: MaintenanceSettings) -> StrengthParams:
    return engine_params(
        StrengthParams,
        m,
        boost="strength_boost",
        decay="strength_decay",
        floor="strength_floor",
        interval_s="decay_interval_s",
    )
