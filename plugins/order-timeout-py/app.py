"""The order-timeout handler in Python, built with componentize-py.

The same logic, log lines and failure reasons as the Rust handler in
plugins/order-timeout/src/lib.rs; see there for the payload and verdicts.
Only the text after `payload is not an order: ` differs, because it comes
from a different JSON parser.
"""

import json

import wit_world
from wit_world.imports import config, log
from wit_world.imports.log import Level
from wit_world.imports.types import (
    Failure,
    Message,
    Outcome,
    Outcome_Fatal,
    Outcome_Ok,
    Outcome_Retryable,
)


class NotAnOrder(Exception):
    pass


def parse_order(payload: bytes):
    """(order_id, status, downstream) from JSON, or NotAnOrder."""
    try:
        value = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise NotAnOrder(str(err)) from None
    if not isinstance(value, dict):
        raise NotAnOrder(f"invalid type: {type(value).__name__}, expected an object")
    fields = []
    for name in ("order_id", "status"):
        if name not in value:
            raise NotAnOrder(f"missing field `{name}`")
        if not isinstance(value[name], str):
            raise NotAnOrder(f"invalid type for `{name}`, expected a string")
        fields.append(value[name])
    downstream = value.get("downstream")
    if downstream is not None and not isinstance(downstream, str):
        raise NotAnOrder("invalid type for `downstream`, expected a string")
    return fields[0], fields[1], downstream


def fatal(reason: str) -> Outcome:
    log.log(Level.ERROR, reason)
    return Outcome_Fatal(Failure(reason=reason, retry_after_ms=None))


class WitWorld(wit_world.WitWorld):
    def handle(self, message: Message) -> Outcome:
        try:
            order_id, status, downstream = parse_order(message.payload or b"")
        except NotAnOrder as err:
            return fatal(f"payload is not an order: {err}")
        service = config.get("order-service")
        if service is None:
            service = "orders"

        if status in ("paid", "cancelled", "closed"):
            log.log(Level.INFO, f"Order {order_id} is {status}, nothing to close.")
            return Outcome_Ok()
        if status in ("pending", "unpaid"):
            if downstream == "down":
                unavailable = True
            elif downstream == "flaky":
                unavailable = message.attempt < 3
            else:
                unavailable = False
            if unavailable:
                log.log(
                    Level.WARN,
                    f"Service {service} unavailable closing order {order_id} on attempt {message.attempt}.",
                )
                return Outcome_Retryable(
                    Failure(reason=f"{service} service unavailable", retry_after_ms=None)
                )
            log.log(Level.INFO, f"Closed unpaid order {order_id} via {service}.")
            return Outcome_Ok()
        return fatal(f"order {order_id} has unknown status `{status}`")
