// {{name}}: a hopper handler. Hopper calls `handle` once per delivery of a
// Kafka message and routes the message on by the outcome.

import { log } from "hopper:handler/log@0.1.1";
import { get } from "hopper:handler/config@0.1.1";

export function handle(message) {
  if (message.payload === undefined) {
    return {
      tag: "fatal",
      val: { reason: "a tombstone has nothing to handle", retryAfterMs: undefined },
    };
  }
  const greeting = get("greeting") ?? "Handled";
  log(
    "info",
    `${greeting} message ${message.id} (${message.payload.length} bytes) on attempt ${message.attempt}.`,
  );
  return { tag: "ok" };
}
