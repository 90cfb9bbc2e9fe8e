"""{{name}}: a hopper handler. Hopper calls `handle` once per delivery of a
Kafka message and routes the message on by the outcome.

Besides deciding, it shows the two things a handler may be granted: one HTTP
call (`http.fetch`) and one emitted record. Each happens only when the
route's config asks for it:
- `lookup-url`: a URL to GET for each message; the route must grant its host
  in `allowed_hosts`;
- `out-topic`: a topic to pass the message on to, with the lookup's status
  in a header; the route must grant it in `emit_topics`.
"""

import wit_world
from componentize_py_types import Err
from wit_world.imports import config, emit, http, log
from wit_world.imports.log import Level
from wit_world.imports.types import (
    Failure,
    Header,
    Message,
    Outcome,
    Outcome_Fatal,
    Outcome_Ok,
    Outcome_Retryable,
)


def get(url: str) -> int:
    """The status of `GET url`; raises Err with a `FetchError_*` when there
    is none (`FetchError_Denied` for a host the route does not grant,
    `FetchError_Timeout` for a service too slow)."""
    request = http.Request(method="GET", url=url, headers=[], body=None)
    return http.fetch(request).status


def retryable(reason: str) -> Outcome:
    log.log(Level.WARN, reason)
    return Outcome_Retryable(Failure(reason=reason, retry_after_ms=None))


def fatal(reason: str) -> Outcome:
    log.log(Level.ERROR, reason)
    return Outcome_Fatal(Failure(reason=reason, retry_after_ms=None))


class WitWorld(wit_world.WitWorld):
    def handle(self, message: Message) -> Outcome:
        if message.payload is None:
            return fatal("a tombstone has nothing to handle")
        # One HTTP call. A service that does not answer, or answers 5xx, may
        # be back later: retryable. Any other failure is fatal.
        status = None
        url = config.get("lookup-url")
        if url is not None:
            try:
                status = get(url)
            except Err as err:
                return retryable(f"{url} unreachable: {type(err.value).__name__}")
            if status >= 500:
                return retryable(f"{url} answered HTTP {status}")
            if not 200 <= status < 300:
                return fatal(f"{url} answered HTTP {status}")
        # One emitted record. It is produced only if this call returns `ok`,
        # before the message's offset is committed.
        topic = config.get("out-topic")
        if topic is not None:
            headers = []
            if status is not None:
                headers.append(Header(key="lookup-status", value=str(status).encode()))
            record = emit.Outgoing(
                topic=topic,
                key=message.key,
                payload=message.payload,
                headers=headers,
                delay_ms=None,
            )
            try:
                emit.publish(record)
            except Err as err:
                return fatal(f"cannot emit to {topic}: {err.value}")
        log.log(
            Level.INFO,
            f"Handled message {message.id} ({len(message.payload)} bytes)"
            f" on attempt {message.attempt}.",
        )
        return Outcome_Ok()
