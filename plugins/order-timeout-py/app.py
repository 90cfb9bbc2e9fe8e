"""The order-timeout handler in Python, built with componentize-py for the
`handler` world.

The same logic, requests, log lines, failure reasons and emitted records as
the Rust handler in plugins/order-timeout/src/lib.rs; see there for the
payload, the config values and the verdicts. Only the text after
`payload is not an order: ` differs, because it comes from a different JSON
parser, and the detail of a transport error in the log.

HTTP is one call, `http.fetch`: the request in, the whole answer out (or
`Err` with a `FetchError_*`). It is synchronous, so there is no event loop.
"""

import json

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


class NotAnOrder(Exception):
    pass


class Unreachable(Exception):
    """No answer from the order service; the text says why."""


def parse_order(payload: bytes) -> str:
    """The `order_id` of an order's timeout, or NotAnOrder."""
    try:
        value = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise NotAnOrder(str(err)) from None
    if not isinstance(value, dict):
        raise NotAnOrder(f"invalid type: {type(value).__name__}, expected an object")
    if "order_id" not in value:
        raise NotAnOrder("missing field `order_id`")
    order = value["order_id"]
    if not isinstance(order, str):
        raise NotAnOrder("invalid type for `order_id`, expected a string")
    try:
        order.encode("utf-8")
    except UnicodeEncodeError:
        # json.loads accepts a lone surrogate escape; no JSON parser of the
        # other builds does.
        raise NotAnOrder("lone surrogate in `order_id`") from None
    return order


def close_url(base: str, order: str):
    """`{base}/orders/{order}/close`, or None when `base` is not
    `http(s)://authority[/prefix]`."""
    if base.startswith("http://"):
        rest = base[len("http://") :]
    elif base.startswith("https://"):
        rest = base[len("https://") :]
    else:
        return None
    slash = rest.find("/")
    authority = rest if slash < 0 else rest[:slash]
    if not authority or "?" in rest or "#" in rest:
        return None
    segment = "".join(
        chr(b) if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "-._~") else f"%{b:02X}"
        for b in order.encode("utf-8")
    )
    return f"{base.rstrip('/')}/orders/{segment}/close"


def post(url: str):
    """(status, body) of `POST url` with an empty body, or Unreachable."""
    request = http.Request(method="POST", url=url, headers=[], body=None)
    try:
        response = http.fetch(request)
    except Err as err:
        raise Unreachable(type(err.value).__name__) from None
    return response.status, bytes(response.body)


def refused(err) -> str:
    """The contract's words for a refused emit, the same in every language."""
    if isinstance(err, emit.EmitError_TopicNotGranted):
        return f"topic {err.value} is not granted"
    if isinstance(err, emit.EmitError_TooManyRecords):
        return f"more than {err.value} records"
    if isinstance(err, emit.EmitError_TooLarge):
        return f"more than {err.value} bytes"
    if isinstance(err, emit.EmitError_NoDelayRelay):
        return "no delay relay"
    return f"invalid record: {err.value}"


def announce(order: str, topic: str, body: bytes) -> Outcome:
    """The order is closed: publish the service's record of it."""
    record = emit.Outgoing(
        topic=topic,
        key=order.encode("utf-8"),
        payload=body,
        headers=[Header(key="content-type", value=b"application/json")],
        delay_ms=None,
    )
    try:
        id = emit.publish(record)
    except Err as err:
        return fatal(f"cannot announce order {order} on {topic}: {refused(err.value)}")
    log.log(Level.INFO, f"Closed unpaid order {order}; announced it on {topic} as {id}.")
    return Outcome_Ok()


def nothing_to_close(order: str, body: bytes) -> Outcome:
    """409: the service would not close the order; its status says why."""
    try:
        value = json.loads(body.decode("utf-8"))
        status = value["status"] if isinstance(value, dict) else ""
        if not isinstance(status, str):
            status = ""
    except (UnicodeDecodeError, ValueError, KeyError):
        status = ""
    if status in ("paid", "cancelled"):
        log.log(Level.INFO, f"Order {order} is {status}, nothing to close.")
        return Outcome_Ok()
    return fatal(f"order {order} has unknown status `{status}`")


def retryable(reason: str) -> Outcome:
    return Outcome_Retryable(Failure(reason=reason, retry_after_ms=None))


def fatal(reason: str) -> Outcome:
    log.log(Level.ERROR, reason)
    return Outcome_Fatal(Failure(reason=reason, retry_after_ms=None))


class WitWorld(wit_world.WitWorld):
    def handle(self, message: Message) -> Outcome:
        try:
            order = parse_order(message.payload or b"")
        except NotAnOrder as err:
            return fatal(f"payload is not an order: {err}")
        base = config.get("order-service")
        if base is None:
            return fatal("route config sets no `order-service` URL")
        topic = config.get("closed-topic")
        if topic is None:
            topic = "orders.closed"
        url = close_url(base, order)
        if url is None:
            return fatal(f"`order-service` is not an http(s) URL: `{base}`")
        try:
            status, body = post(url)
        except Unreachable as err:
            log.log(Level.WARN, f"Order service unreachable closing order {order}: {err}.")
            return retryable("order service unreachable")
        if status == 200:
            return announce(order, topic, body)
        if status == 409:
            return nothing_to_close(order, body)
        if status == 404:
            return fatal(f"order {order} is unknown to the order service")
        if 500 <= status <= 599:
            log.log(
                Level.WARN,
                f"Order service unavailable (HTTP {status}) closing order {order}.",
            )
            return retryable(f"order service unavailable (HTTP {status})")
        return fatal(f"order service answered HTTP {status} closing order {order}")
