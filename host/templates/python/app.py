"""{{name}}: a hopper handler. Hopper calls `handle` once per delivery of a
Kafka message and routes the message on by the outcome.

Besides deciding, it shows the two things a handler may be granted: one HTTP
call (through wasi:http, with componentize-py's `poll_loop`) and one emitted
record. Each happens only when the route's config asks for it:
- `lookup-url`: a URL to GET for each message; the route must grant its host
  in `allowed_hosts`;
- `out-topic`: a topic to pass the message on to, with the lookup's status
  in a header; the route must grant it in `emit_topics`.

The world is `handler-http`, which has two interfaces called `types`
(hopper's and wasi:http's): componentize-py names them
`hopper_handler_types` and `wasi_http_types`. `poll_loop` imports
`wit_world.imports.types`, so the alias below must run before it is imported.
"""

import asyncio
import sys
from urllib.parse import urlsplit

import wit_world
from wit_world import imports
from wit_world.imports import config, emit, log, wasi_http_types
from wit_world.imports.log import Level

imports.types = wasi_http_types
sys.modules["wit_world.imports.types"] = wasi_http_types

import poll_loop  # noqa: E402  (needs the alias above)
from componentize_py_types import Err  # noqa: E402
from wit_world.imports.hopper_handler_types import (  # noqa: E402
    Failure,
    Header,
    Message,
    Outcome,
    Outcome_Fatal,
    Outcome_Ok,
    Outcome_Retryable,
)
from wit_world.imports.wasi_http_types import (  # noqa: E402
    Fields,
    Method_Get,
    OutgoingRequest,
    Scheme_Http,
    Scheme_Https,
)


def get(url: str) -> int:
    """The status of `GET url`; raises Err when there is none (refused,
    timed out, not granted: the host answers `HTTP-request-denied`)."""
    parts = urlsplit(url)
    request = OutgoingRequest(Fields())
    request.set_method(Method_Get())
    request.set_scheme(Scheme_Https() if parts.scheme == "https" else Scheme_Http())
    request.set_authority(parts.netloc)
    request.set_path_with_query(parts.path or "/")

    async def send() -> int:
        response = await poll_loop.send(request)
        return response.status()

    # The export is synchronous: run the event loop until the answer is there.
    loop = poll_loop.PollLoop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(send())
    finally:
        loop.close()


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
