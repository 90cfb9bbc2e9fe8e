// {{name}}: a hopper handler. Hopper calls `handle` once per delivery of a
// Kafka message and routes the message on by the outcome.
//
// Besides deciding, it shows the two things a handler may be granted: one
// HTTP call (`fetch` from `hopper:handler/http`: the request in, the whole
// response out, synchronously) and one emitted record. Each happens only
// when the route's config asks for it:
// - `lookup-url`: a URL to GET for each message; the route must grant its
//   host in `allowed_hosts`;
// - `out-topic`: a topic to pass the message on to, with the lookup's status
//   in a header; the route must grant it in `emit_topics`.
//
// A failed `fetch` throws its `fetch-error` (`{ tag, val }`, for example
// `denied` for a host the route does not grant); so does a refused emit.
// An exception that escapes `handle` traps the call, so every path here
// returns an outcome.

import { log } from "hopper:handler/log@0.1.3";
import { get } from "hopper:handler/config@0.1.3";
import { publish } from "hopper:handler/emit@0.1.3";
import { fetch } from "hopper:handler/http@0.1.3";

function retryable(reason) {
  log("warn", reason);
  return { tag: "retryable", val: { reason, retryAfterMs: undefined } };
}

function fatal(reason) {
  log("error", reason);
  return { tag: "fatal", val: { reason, retryAfterMs: undefined } };
}

export function handle(message) {
  if (message.payload === undefined) {
    return fatal("a tombstone has nothing to handle");
  }
  // One HTTP call. A service that does not answer (a host the route does not
  // grant is `denied` too), or answers 5xx, may be back later: retryable.
  // Any other failure is fatal.
  let status;
  const url = get("lookup-url");
  if (url !== undefined) {
    try {
      status = fetch({ method: "GET", url, headers: [], body: undefined }).status;
    } catch (err) {
      const why = err?.payload ?? err;
      return retryable(`${url} unreachable: ${why.tag} ${why.val ?? ""}`);
    }
    if (status >= 500) {
      return retryable(`${url} answered HTTP ${status}`);
    }
    if (status < 200 || status >= 300) {
      return fatal(`${url} answered HTTP ${status}`);
    }
  }
  // One emitted record. It is produced only if this call returns `ok`,
  // before the message's offset is committed.
  const topic = get("out-topic");
  if (topic !== undefined) {
    const headers =
      status === undefined
        ? []
        : [{ key: "lookup-status", value: new TextEncoder().encode(String(status)) }];
    try {
      publish({ topic, key: message.key, payload: message.payload, headers, delayMs: undefined });
    } catch (err) {
      const refused = err?.payload ?? err;
      return fatal(`cannot emit to ${topic}: ${refused.tag} ${refused.val ?? ""}`);
    }
  }
  log(
    "info",
    `Handled message ${message.id} (${message.payload.length} bytes) on attempt ${message.attempt}.`,
  );
  return { tag: "ok" };
}
