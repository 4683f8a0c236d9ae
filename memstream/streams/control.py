"""The ``control`` processor: operator and API commands every stage obeys.

``forget_user`` is published by ``DELETE /v1/users/{user}`` (and ``memstream forget``) after
the RPC has already deleted the user. Handling it here again makes the forget stick against
what was in flight: the tombstone makes ``memorize`` drop the user's events stamped before
the forget (in the topics, or replayed later), and the deletes sweep whatever a processor
wrote between the RPC's delete and now. Every step is idempotent, so a redelivered command
changes nothing. ``pin_memory`` is left to the consolidation workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from memstream.metrics import StageSeries
from memstream.schemas import Control
from memstream.stores.forget import forget_user
from memstream.stores.longterm import LongTermStore
from memstream.stores.short_term import ShortTermState
from memstream.streaming.services import Services, StageSpec
from memstream.streaming.stage import Outcome, Received, Stage

NAME = "control"


@dataclass
class Controller:
    """The control stage's handler: a ``forget_user`` forgets the command's user (tombstone
    at the command's time, then every short- and long-term trace); other actions are
    skipped here."""

    stage: Stage
    state: ShortTermState
    longterm: LongTermStore

    async def handle(self, message: Received[Control]) -> Outcome:
        command = message.value
        if command.action != "forget_user":
            return "skipped"
        at = command.ts.timestamp()
        await self.stage.retry(
            partial(forget_user, self.state, self.longterm, command.tenant_id, command.user_id, at)
        )
        return "ok"


def start(services: Services) -> None:
    stage = services.stage(NAME, services.topics.control)
    controller = Controller(stage, services.state, services.longterm)
    stage.per_message(services.app, Control, controller.handle, agent="memstream.control")


# Forget commands: the partition owner drops the user's in-flight data too.
STAGE = StageSpec("process", start, series=(StageSeries(NAME, ("ok", "skipped", "dlq")),))
