// {{name}}: a hopper handler. Hopper calls `handle` once per delivery of a
// Kafka message and routes the message on by the outcome.
//
// Besides deciding, it shows the two things a handler may be granted: one
// HTTP call (`hopper_handler_http_fetch`: the request in, the whole response
// out) and one emitted record. Each happens only when the route's config asks for it:
// - `lookup-url`: a URL to GET for each message; the route must grant its
//   host in `allowed_hosts`;
// - `out-topic`: a topic to pass the message on to, with the lookup's status
//   in a header; the route must grant it in `emit_topics`.
//
// handler.h is generated from wit/ by `wit-bindgen c` (build.sh). Every
// resource the bindings hand out is this code's to drop, children before
// parents: a handle left behind lives on in the instance, which hopper keeps
// warm across calls.

#include "handler.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void log_line(hopper_handler_log_level_t level, const char *text) {
  handler_string_t message;
  handler_string_set(&message, text);
  hopper_handler_log_log(level, &message);
}

// Sets `ret` to a failure (tag RETRYABLE or FATAL) with a formatted reason,
// which the generated post-return code frees.
static void fail(handler_outcome_t *ret, uint8_t tag, const char *fmt, ...) {
  char reason[512];
  va_list args;
  va_start(args, fmt);
  vsnprintf(reason, sizeof reason, fmt, args);
  va_end(args);
  log_line(tag == HOPPER_HANDLER_TYPES_OUTCOME_FATAL ? HOPPER_HANDLER_LOG_LEVEL_ERROR
                                                     : HOPPER_HANDLER_LOG_LEVEL_WARN,
           reason);
  ret->tag = tag;
  hopper_handler_types_failure_t *failure =
      tag == HOPPER_HANDLER_TYPES_OUTCOME_FATAL ? &ret->val.fatal : &ret->val.retryable;
  handler_string_dup(&failure->reason, reason);
  failure->retry_after_ms.is_some = false;
}

// The route's config value `key` into `out` (NUL-terminated); false when the
// route does not set it.
static bool config_value(const char *key, char *out, size_t size) {
  handler_string_t name, value;
  handler_string_set(&name, key);
  if (!hopper_handler_config_get(&name, &value)) return false;
  snprintf(out, size, "%.*s", (int)value.len, (const char *)value.ptr);
  handler_string_free(&value);
  return true;
}

// The status of `GET url`, or 0 when there is none (refused, timed out, not
// granted: `fetch` fails with HOPPER_HANDLER_HTTP_FETCH_ERROR_DENIED).
static uint16_t get(const char *url) {
  // No headers, no body: zeroed lists and options.
  hopper_handler_http_request_t request;
  memset(&request, 0, sizeof request);
  handler_string_set(&request.method, "GET");
  handler_string_set(&request.url, url);
  hopper_handler_http_response_t response;
  hopper_handler_http_fetch_error_t error;
  if (!hopper_handler_http_fetch(&request, &response, &error)) {
    hopper_handler_http_fetch_error_free(&error);
    return 0;
  }
  uint16_t status = response.status;
  hopper_handler_http_response_free(&response);
  return status;
}

static void handle(handler_message_t *message, handler_outcome_t *ret) {
  if (!message->payload.is_some) {
    fail(ret, HOPPER_HANDLER_TYPES_OUTCOME_FATAL, "a tombstone has nothing to handle");
    return;
  }
  // One HTTP call. A service that does not answer, or answers 5xx, may be
  // back later: retryable. Any other failure is fatal.
  uint16_t status = 0;
  char url[512];
  if (config_value("lookup-url", url, sizeof url)) {
    status = get(url);
    if (status == 0 || status >= 500) {
      fail(ret, HOPPER_HANDLER_TYPES_OUTCOME_RETRYABLE, "%s unavailable (HTTP %u)", url, status);
      return;
    }
    if (status < 200 || status >= 300) {
      fail(ret, HOPPER_HANDLER_TYPES_OUTCOME_FATAL, "%s answered HTTP %u", url, status);
      return;
    }
  }
  // One emitted record. It is produced only if this call returns `ok`,
  // before the message's offset is committed.
  char topic[256];
  if (config_value("out-topic", topic, sizeof topic)) {
    char status_text[8];
    snprintf(status_text, sizeof status_text, "%u", status);
    hopper_handler_emit_header_t header;
    handler_string_set(&header.key, "lookup-status");
    header.value.ptr = (uint8_t *)status_text;
    header.value.len = strlen(status_text);
    hopper_handler_emit_outgoing_t record = {
        .key = {.is_some = message->key.is_some, .val = message->key.val},
        .payload = {.is_some = true, .val = message->payload.val},
        .headers = {&header, status != 0 ? 1 : 0},
        .delay_ms = {.is_some = false},
    };
    handler_string_set(&record.topic, topic);
    handler_string_t id;
    hopper_handler_emit_emit_error_t err;
    if (!hopper_handler_emit_publish(&record, &id, &err)) {
      fail(ret, HOPPER_HANDLER_TYPES_OUTCOME_FATAL, "cannot emit to %s (error %u)", topic,
           (unsigned)err.tag);
      hopper_handler_emit_emit_error_free(&err);
      return;
    }
    handler_string_free(&id);
  }
  char line[256];
  snprintf(line, sizeof line, "Handled message %.*s (%zu bytes) on attempt %u.",
           (int)message->id.len, (const char *)message->id.ptr, message->payload.val.len,
           (unsigned)message->attempt);
  log_line(HOPPER_HANDLER_LOG_LEVEL_INFO, line);
  ret->tag = HOPPER_HANDLER_TYPES_OUTCOME_OK;
}

// The generated export: the message is ours to free.
void exports_handler_handle(handler_message_t *message, handler_outcome_t *ret) {
  handle(message, ret);
  hopper_handler_types_message_free(message);
}
