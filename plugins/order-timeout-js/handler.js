// The order-timeout handler in JavaScript, built with componentize-js.
//
// The same logic, requests, log lines, failure reasons and emitted records
// as the Rust handler in plugins/order-timeout/src/lib.rs; see there for the
// payload, the config values and the verdicts. Only the text after
// `payload is not an order: ` differs, because it comes from a different
// JSON parser, and the detail of a transport error in the log.
//
// HTTP is hopper's one call, `fetch` from `hopper:handler/http`: the request
// in, the whole response out, synchronously; a `fetch-error` is thrown. It
// is not the web's `fetch`, which componentize-js's `http` feature would
// give; that feature is disabled.

import { log } from "hopper:handler/log@0.1.3";
import { get } from "hopper:handler/config@0.1.3";
import { publish } from "hopper:handler/emit@0.1.3";
import { fetch } from "hopper:handler/http@0.1.3";

class NotAnOrder extends Error {}

/** The `order_id` of an order's timeout, or throws NotAnOrder. */
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
  if (!Object.hasOwn(value, "order_id")) {
    throw new NotAnOrder("missing field `order_id`");
  }
  const order = value.order_id;
  if (typeof order !== "string") {
    throw new NotAnOrder("invalid type for `order_id`, expected a string");
  }
  // JSON.parse accepts a lone surrogate escape; no parser of the other
  // builds does, and it has no UTF-8 form.
  if (!order.isWellFormed()) {
    throw new NotAnOrder("lone surrogate in `order_id`");
  }
  return order;
}

/** `{base}/orders/{order}/close`, or null when `base` is not
 * `http(s)://authority[/prefix]`. */
function closeUrl(base, order) {
  let rest;
  if (base.startsWith("http://")) {
    rest = base.slice("http://".length);
  } else if (base.startsWith("https://")) {
    rest = base.slice("https://".length);
  } else {
    return null;
  }
  const slash = rest.indexOf("/");
  const authority = slash < 0 ? rest : rest.slice(0, slash);
  const prefix = slash < 0 ? "" : rest.slice(slash);
  if (authority === "" || rest.includes("?") || rest.includes("#")) {
    return null;
  }
  let segment = "";
  for (const byte of new TextEncoder().encode(order)) {
    const c = String.fromCharCode(byte);
    segment += /[A-Za-z0-9\-._~]/.test(c)
      ? c
      : `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  const scheme = base.slice(0, base.length - rest.length);
  return `${scheme}${authority}${prefix.replace(/\/+$/, "")}/orders/${segment}/close`;
}

/** The contract's words for a refused emit, the same in every language. */
function refused(err) {
  switch (err.tag) {
    case "topic-not-granted":
      return `topic ${err.val} is not granted`;
    case "too-many-records":
      return `more than ${err.val} records`;
    case "too-large":
      return `more than ${err.val} bytes`;
    case "no-delay-relay":
      return "no delay relay";
    default:
      return `invalid record: ${err.val}`;
  }
}

/** The order is closed: publish the service's record of it. */
function announce(order, topic, body) {
  let id;
  try {
    id = publish({
      topic,
      key: new TextEncoder().encode(order),
      payload: body,
      headers: [{ key: "content-type", value: new TextEncoder().encode("application/json") }],
      delayMs: undefined,
    });
  } catch (err) {
    // The emit-error variant, thrown; some bindings wrap it in `payload`.
    const why = refused(err?.payload ?? err);
    return fatal(`cannot announce order ${order} on ${topic}: ${why}`);
  }
  log("info", `Closed unpaid order ${order}; announced it on ${topic} as ${id}.`);
  return { tag: "ok" };
}

/** 409: the service would not close the order; its status says why. */
function nothingToClose(order, body) {
  let status = "";
  try {
    const value = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(body));
    if (value !== null && typeof value === "object" && typeof value.status === "string") {
      status = value.status;
    }
  } catch {
    // Not JSON: no status.
  }
  if (status === "paid" || status === "cancelled") {
    log("info", `Order ${order} is ${status}, nothing to close.`);
    return { tag: "ok" };
  }
  return fatal(`order ${order} has unknown status \`${status}\``);
}

function retryable(reason) {
  return { tag: "retryable", val: { reason, retryAfterMs: undefined } };
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
    return fatal(`payload is not an order: ${err.message}`);
  }
  const base = get("order-service");
  if (base === undefined) {
    return fatal("route config sets no `order-service` URL");
  }
  const topic = get("closed-topic") ?? "orders.closed";
  const url = closeUrl(base, order);
  if (url === null) {
    return fatal(`\`order-service\` is not an http(s) URL: \`${base}\``);
  }
  let status, body;
  try {
    ({ status, body } = fetch({ method: "POST", url, headers: [], body: undefined }));
  } catch (err) {
    // The fetch-error variant, thrown; some bindings wrap it in `payload`.
    const why = err?.payload ?? err;
    log("warn", `Order service unreachable closing order ${order}: ${why.tag ?? why.message}.`);
    return retryable("order service unreachable");
  }
  if (status === 200) {
    return announce(order, topic, body);
  }
  if (status === 409) {
    return nothingToClose(order, body);
  }
  if (status === 404) {
    return fatal(`order ${order} is unknown to the order service`);
  }
  if (status >= 500 && status <= 599) {
    log("warn", `Order service unavailable (HTTP ${status}) closing order ${order}.`);
    return retryable(`order service unavailable (HTTP ${status})`);
  }
  return fatal(`order service answered HTTP ${status} closing order ${order}`);
}
