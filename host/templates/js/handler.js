// {{name}}: a hopper handler. Hopper calls `handle` once per delivery of a
// Kafka message and routes the message on by the outcome.
//
// Besides deciding, it does the two things a handler may be granted: one
// HTTP call (`fetch`, from componentize-js's `http` feature) and one emitted
// record. Route config values, and the grants they need:
// - `lookup-url`: a URL to GET for each message (`allowed_hosts`);
// - `out-topic`: where the message goes on (`emit_topics`), by default
//   `{{name}}.out`.
//
// `handle` is async because `fetch` is: componentize-js runs the event loop
// until the promise settles, behind the synchronous WIT export. A promise
// that rejects traps the call, so every path returns an outcome.

import { log } from "hopper:handler/log@0.1.1";
import { get } from "hopper:handler/config@0.1.1";
import { publish } from "hopper:handler/emit@0.1.1";

function retryable(reason) {
  log("warn", reason);
  return { tag: "retryable", val: { reason, retryAfterMs: undefined } };
}

function fatal(reason) {
  log("error", reason);
  return { tag: "fatal", val: { reason, retryAfterMs: undefined } };
}

export async function handle(message) {
  if (message.payload === undefined) {
    return fatal("a tombstone has nothing to handle");
  }
  const url = get("lookup-url");
  if (url === undefined) {
    return fatal("route config sets no `lookup-url`");
  }
  // A service that does not answer, or answers 5xx, may be back later. A
  // host the route does not grant rejects the fetch too.
  let status;
  try {
    status = (await fetch(url)).status;
  } catch (err) {
    return retryable(`${url} unreachable: ${err.message}`);
  }
  if (status >= 500) {
    return retryable(`${url} answered HTTP ${status}`);
  }
  if (status < 200 || status >= 300) {
    return fatal(`${url} answered HTTP ${status}`);
  }
  // Produced only if this call returns `ok`, before the message's offset is
  // committed.
  const topic = get("out-topic") ?? "{{name}}.out";
  let id;
  try {
    id = publish({
      topic,
      key: message.key,
      payload: message.payload,
      headers: [{ key: "lookup-status", value: new TextEncoder().encode(String(status)) }],
      delayMs: undefined,
    });
  } catch (err) {
    const refused = err?.payload ?? err;
    return fatal(`cannot emit to ${topic}: ${refused.tag} ${refused.val ?? ""}`);
  }
  log("info", `Passed message ${message.id} on to ${topic} as ${id}.`);
  return { tag: "ok" };
}
