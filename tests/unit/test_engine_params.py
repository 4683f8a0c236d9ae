"""The engine's parameters come from settings with each default written once, in memory/:
a section's engine field left None takes the dataclass default, one set by a MEMSTREAM_*
variable reaches the engine, and a field the dataclass lacks is an error."""

from __future__ import annotations

import os

import pytest

from memstream.memory.clustering import ClusterParams
from memstream.memory.links import LinkParams
from memstream.memory.recurrence import RecurrenceParams
from memstream.memory.strength import StrengthParams
from memstream.settings import ClusterSettings, RecurrenceSettings, Settings, _Section
from memstream.streaming.params import (
    cluster_params,
    engine_fields,
    engine_params,
    link_params,
    recurrence_params,
    strength_params,
    written_out,
)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in [n for n in os.environ if n.upper().startswith("MEMSTREAM_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_unset_settings_give_the_engine_defaults(env: pytest.MonkeyPatch) -> None:
    settings = Settings()
    assert cluster_params(settings.cluster) == ClusterParams()
    assert recurrence_params(settings.recurrence) == RecurrenceParams()
    assert strength_params(settings.maintenance) == StrengthParams()
    assert link_params(settings.consolidation) == LinkParams()


def test_variables_reach_the_engine_under_their_names(env: pytest.MonkeyPatch) -> None:
    env.setenv("MEMSTREAM_CLUSTER__MERGE_THRESHOLD", "0.8")
    env.setenv("MEMSTREAM_CLUSTER__BUFFER_SIZE", "4")
    env.setenv("MEMSTREAM_RECURRENCE__EAGER", "true")
    env.setenv("MEMSTREAM_MAINTENANCE__STRENGTH_BOOST", "1.5")
    env.setenv("MEMSTREAM_MAINTENANCE__DECAY_INTERVAL_S", "60")
    env.setenv("MEMSTREAM_CONSOLIDATION__LINK_SIMILARITY", "0.9")
    env.setenv("MEMSTREAM_CONSOLIDATION__MAX_LINKS", "3")
    settings = Settings()
    clusters = cluster_params(settings.cluster)
    assert (clusters.merge_threshold, clusters.buffer_size) == (0.8, 4)
    assert clusters.create_threshold == ClusterParams().create_threshold
    assert recurrence_params(settings.recurrence).eager is True
    strength = strength_params(settings.maintenance)
    assert (strength.boost, strength.interval_s, strength.decay) == (1.5, 60.0, 0.99)
    assert link_params(settings.consolidation) == LinkParams(similarity=0.9, max_links=3)


def test_the_longmemeval_preset_fills_what_is_not_set(env: pytest.MonkeyPatch) -> None:
    env.setenv("MEMSTREAM_RECURRENCE__PRESET", "longmemeval")
    env.setenv("MEMSTREAM_RECURRENCE__SIMILARITY", "0.65")
    params = recurrence_params(Settings().recurrence)
    assert (params.min_similar, params.similarity) == (4, 0.65)


def test_an_engine_field_without_a_parameter_is_an_error() -> None:
    class Misnamed(_Section):
        merge_treshold: float | None = None

    with pytest.raises(TypeError, match=r"ClusterParams has no field for \['merge_treshold'\]"):
        engine_params(ClusterParams, Misnamed())


def test_only_fields_declared_none_are_the_engines() -> None:
    assert "cache_users" not in engine_fields(ClusterSettings)
    assert {"window_turns", "preset", "common_phrase_users"}.isdisjoint(
        engine_fields(RecurrenceSettings)
    )


def test_a_generation_records_the_values_written_out() -> None:
    section = ClusterSettings(merge_threshold=0.7)
    recorded = written_out(section, cluster_params(section)).model_dump(mode="json")
    assert None not in recorded.values()
    assert recorded["merge_threshold"] == 0.7
    assert recorded["buffer_size"] == ClusterParams().buffer_size
    # Read back (memstream.generations.apply_generation), it builds the same engine.
    assert cluster_params(ClusterSettings.model_validate(recorded)) == cluster_params(section)


def test_a_preset_generation_reads_back_as_the_same_engine() -> None:
    section = RecurrenceSettings(preset="longmemeval")
    recorded = written_out(section, recurrence_params(section)).model_dump(mode="json")
    assert (recorded["min_similar"], recorded["similarity"]) == (4, 0.6)
    assert recurrence_params(RecurrenceSettings.model_validate(recorded)) == recurrence_params(
        section
    )
