// {{name}}: a hopper handler. Hopper calls `handle` once per delivery of a
// Kafka message and routes the message on by the outcome.
//
// Besides deciding, it shows the two things a handler may be granted: one
// HTTP call (wasi:http, through wit-bindgen's C bindings) and one emitted
// record. Each happens only when the route's config asks for it:
// - `lookup-url`: a URL to GET for each message; the route must grant its
//   host in `allowed_hosts`;
// - `out-topic`: a topic to pass the message on to, with the lookup's status
//   in a header; the route must grant it in `emit_topics`.
//
// handler_http.h is generated from wit/ by `wit-bindgen c` (build.sh). Every
// resource the bindings hand out is this code's to drop, children before
// parents: a handle left behind lives on in the instance, which hopper keeps
// warm across calls.

#include "handler_http.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void log_line(hopper_handler_log_level_t level, const char *text) {
  handler_http_string_t message;
  handler_http_string_set(&message, text);
  hopper_handler_log_log(level, &message);
}

// Sets `ret` to a failure (tag RETRYABLE or FATAL) with a formatted reason,
// which the generated post-return code frees.
static void fail(handler_http_outcome_t *ret, uint8_t tag, const char *fmt, ...) {
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
  handler_http_string_dup(&failure->reason, reason);
  failure->retry_after_ms.is_some = false;
}

// The route's config value `key` into `out` (NUL-terminated); false when the
// route does not set it.
static bool config_value(const char *key, char *out, size_t size) {
  handler_http_string_t name, value;
  handler_http_string_set(&name, key);
  if (!hopper_handler_config_get(&name, &value)) return false;
  snprintf(out, size, "%.*s", (int)value.len, (const char *)value.ptr);
  handler_http_string_free(&value);
  return true;
}

// The status of `GET url`, or 0 when there is none (refused, timed out, not
// granted: the host answers HTTP-request-denied).
static uint16_t get(const char *url) {
  const char *rest = strstr(url, "://");
  if (rest == NULL) return 0;
  bool https = strncmp(url, "https", 5) == 0;
  rest += 3;
  const char *slash = strchr(rest, '/');
  char authority[256];
  snprintf(authority, sizeof authority, "%.*s", (int)(slash ? slash - rest : (long)strlen(rest)),
           rest);

  wasi_http_types_own_outgoing_request_t request =
      wasi_http_types_constructor_outgoing_request(wasi_http_types_constructor_fields());
  wasi_http_types_borrow_outgoing_request_t r = wasi_http_types_borrow_outgoing_request(request);
  wasi_http_types_scheme_t scheme = {
      .tag = https ? WASI_HTTP_TYPES_SCHEME_HTTPS : WASI_HTTP_TYPES_SCHEME_HTTP};
  handler_http_string_t host, path;
  handler_http_string_set(&host, authority);
  handler_http_string_set(&path, slash ? slash : "/");
  if (!wasi_http_types_method_outgoing_request_set_scheme(r, &scheme) ||
      !wasi_http_types_method_outgoing_request_set_authority(r, &host) ||
      !wasi_http_types_method_outgoing_request_set_path_with_query(r, &path)) {
    wasi_http_types_outgoing_request_drop_own(request);
    return 0;
  }
  // `handle` takes ownership of the request.
  wasi_http_outgoing_handler_own_future_incoming_response_t future;
  wasi_http_outgoing_handler_error_code_t code;
  if (!wasi_http_outgoing_handler_handle(request, NULL, &future, &code)) {
    wasi_http_outgoing_handler_error_code_free(&code);
    return 0;
  }
  // The export is synchronous: block until the answer is there.
  wasi_http_types_borrow_future_incoming_response_t pending =
      wasi_http_types_borrow_future_incoming_response(future);
  wasi_io_poll_own_pollable_t ready =
      wasi_http_types_method_future_incoming_response_subscribe(pending);
  wasi_io_poll_method_pollable_block(wasi_io_poll_borrow_pollable(ready));
  wasi_io_poll_pollable_drop_own(ready);

  uint16_t status = 0;
  wasi_http_types_result_result_own_incoming_response_error_code_void_t got;
  if (wasi_http_types_method_future_incoming_response_get(pending, &got) && !got.is_err) {
    if (got.val.ok.is_err) {
      wasi_http_types_error_code_free(&got.val.ok.val.err);
    } else {
      wasi_http_types_own_incoming_response_t response = got.val.ok.val.ok;
      status = wasi_http_types_method_incoming_response_status(
          wasi_http_types_borrow_incoming_response(response));
      wasi_http_types_incoming_response_drop_own(response);
    }
  }
  wasi_http_types_future_incoming_response_drop_own(future);
  return status;
}

static void handle(handler_http_message_t *message, handler_http_outcome_t *ret) {
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
    handler_http_string_set(&header.key, "lookup-status");
    header.value.ptr = (uint8_t *)status_text;
    header.value.len = strlen(status_text);
    hopper_handler_emit_outgoing_t record = {
        .key = {.is_some = message->key.is_some, .val = message->key.val},
        .payload = {.is_some = true, .val = message->payload.val},
        .headers = {&header, status != 0 ? 1 : 0},
        .delay_ms = {.is_some = false},
    };
    handler_http_string_set(&record.topic, topic);
    handler_http_string_t id;
    hopper_handler_emit_emit_error_t err;
    if (!hopper_handler_emit_publish(&record, &id, &err)) {
      fail(ret, HOPPER_HANDLER_TYPES_OUTCOME_FATAL, "cannot emit to %s (error %u)", topic,
           (unsigned)err.tag);
      hopper_handler_emit_emit_error_free(&err);
      return;
    }
    handler_http_string_free(&id);
  }
  char line[256];
  snprintf(line, sizeof line, "Handled message %.*s (%zu bytes) on attempt %u.",
           (int)message->id.len, (const char *)message->id.ptr, message->payload.val.len,
           (unsigned)message->attempt);
  log_line(HOPPER_HANDLER_LOG_LEVEL_INFO, line);
  ret->tag = HOPPER_HANDLER_TYPES_OUTCOME_OK;
}

// The generated export: the message is ours to free.
void exports_handler_http_handle(handler_http_message_t *message, handler_http_outcome_t *ret) {
  handle(message, ret);
  hopper_handler_types_message_free(message);
}
