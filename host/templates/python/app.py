"""{{name}}: a hopper handler. Hopper calls `handle` once per delivery of a
Kafka message and routes the message on by the outcome."""

import wit_world
from wit_world.imports import config, log
from wit_world.imports.log import Level
from wit_world.imports.types import Failure, Message, Outcome, Outcome_Fatal, Outcome_Ok


class WitWorld(wit_world.WitWorld):
    def handle(self, message: Message) -> Outcome:
        if message.payload is None:
            return Outcome_Fatal(
                Failure(reason="a tombstone has nothing to handle", retry_after_ms=None)
            )
        greeting = config.get("greeting") or "Handled"
        log.log(
            Level.INFO,
            f"{greeting} message {message.id} ({len(message.payload)} bytes)"
            f" on attempt {message.attempt}.",
        )
        return Outcome_Ok()
