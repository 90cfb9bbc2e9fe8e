// The order-timeout handler in JavaScript, built with jco (componentize-js).
//
// The same logic, log lines and failure reasons as the Rust handler in
// plugins/order-timeout/src/lib.rs; see there for the payload and verdicts.
// Only the text after `payload is not an order: ` differs, because it comes
// from a different JSON parser.

import { log } from "hopper:handler/log@0.1.1";
import { get } from "hopper:handler/config@0.1.1";

class NotAnOrder extends Error {}

/** { orderId, status, downstream } from JSON, or throws NotAnOrder. */
function parseOrder(payload) {
  let value;
  try {
    const text = new TextDecoder("utf-8", { fatal: true }).decode(payload);
    value = JSON.parse(text);
  } catch (err) {
    throw new NotAnOrder(err.message);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    const type = value === null ? "null" : Array.isArray(value) ? "array" : typeof value;
    throw new NotAnOrder(`invalid type: ${type}, expected an object`);
  }
  for (const name of ["order_id", "status"]) {
    if (!Object.hasOwn(value, name)) {
      throw new NotAnOrder(`missing field \`${name}\``);
    }
    if (typeof value[name] !== "string") {
      throw new NotAnOrder(`invalid type for \`${name}\`, expected a string`);
    }
  }
  const downstream = value.downstream ?? null;
  if (downstream !== null && typeof downstream !== "string") {
    throw new NotAnOrder("invalid type for `downstream`, expected a string");
  }
  return { orderId: value.order_id, status: value.status, downstream };
}

function fatal(reason) {
  log("error", reason);
  return { tag: "fatal", val: { reason, retryAfterMs: undefined } };
}

export function handle(message) {
  let order;
  try {
    order = parseOrder(message.payload ?? new Uint8Array());
  } catch (err) {
    if (err instanceof NotAnOrder) {
      return fatal(`payload is not an order: ${err.message}`);
    }
    throw err;
  }
  const service = get("order-service") ?? "orders";
  const { orderId, status, downstream } = order;

  switch (status) {
    case "paid":
    case "cancelled":
    case "closed":
      log("info", `Order ${orderId} is ${status}, nothing to close.`);
      return { tag: "ok" };
    case "pending":
    case "unpaid": {
      let unavailable = false;
      if (downstream === "down") {
        unavailable = true;
      } else if (downstream === "flaky") {
        unavailable = message.attempt < 3;
      }
      if (unavailable) {
        log(
          "warn",
          `Service ${service} unavailable closing order ${orderId} on attempt ${message.attempt}.`,
        );
        return {
          tag: "retryable",
          val: { reason: `${service} service unavailable`, retryAfterMs: undefined },
        };
      }
      log("info", `Closed unpaid order ${orderId} via ${service}.`);
      return { tag: "ok" };
    }
    default:
      return fatal(`order ${orderId} has unknown status \`${status}\``);
  }
}
