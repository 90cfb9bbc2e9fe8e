// The order-timeout handler in C, built with wit-bindgen's C generator
// (world `handler`; HTTP through its `fetch`), clang for wasm32-wasi and jco
// (core module to component).
//
// The same logic, requests, log lines, failure reasons and emitted records
// as the Rust handler in plugins/order-timeout/src/lib.rs; see there for the
// payload, the config values and the verdicts. Only the text after
// `payload is not an order: ` differs, because it comes from a different
// JSON parser (json.c), and the detail of a transport error in the log.
//
// handler.h is generated from wit/ by `wit-bindgen c`.

#include "handler.h"
#include "json.h"
#include "service.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// A malloc'd, formatted string.
static char *format(const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  int len = vsnprintf(NULL, 0, fmt, args);
  va_end(args);
  char *out = malloc((size_t)len + 1);
  if (out == NULL) abort();
  va_start(args, fmt);
  vsnprintf(out, (size_t)len + 1, fmt, args);
  va_end(args);
  return out;
}

static void log_line(hopper_handler_log_level_t level, const char *text) {
  handler_string_t message;
  handler_string_set(&message, text);
  hopper_handler_log_log(level, &message);
}

// Sets `ret` to a failure that owns `reason` (freed by the generated
// post-return code).
static void fail(handler_outcome_t *ret, uint8_t tag, char *reason) {
  ret->tag = tag;
  hopper_handler_types_failure_t *failure =
      tag == HOPPER_HANDLER_TYPES_OUTCOME_FATAL ? &ret->val.fatal : &ret->val.retryable;
  failure->reason.ptr = (uint8_t *)reason;
  failure->reason.len = strlen(reason);
  failure->retry_after_ms.is_some = false;
}

static void fatal(handler_outcome_t *ret, char *reason) {
  log_line(HOPPER_HANDLER_LOG_LEVEL_ERROR, reason);
  fail(ret, HOPPER_HANDLER_TYPES_OUTCOME_FATAL, reason);
}

// The route's config value `key`, malloc'd, or NULL when it is not set.
static char *config_value(const char *key) {
  handler_string_t name, value;
  handler_string_set(&name, key);
  if (!hopper_handler_config_get(&name, &value)) return NULL;
  char *out = format("%.*s", (int)value.len, (const char *)value.ptr);
  handler_string_free(&value);
  return out;
}

// The contract's words for a refused emit, the same in every language.
static char *refused(const hopper_handler_emit_emit_error_t *err) {
  switch (err->tag) {
    case HOPPER_HANDLER_EMIT_EMIT_ERROR_TOPIC_NOT_GRANTED:
      return format("topic %.*s is not granted", (int)err->val.topic_not_granted.len,
                    (const char *)err->val.topic_not_granted.ptr);
    case HOPPER_HANDLER_EMIT_EMIT_ERROR_TOO_MANY_RECORDS:
      return format("more than %u records", (unsigned)err->val.too_many_records);
    case HOPPER_HANDLER_EMIT_EMIT_ERROR_TOO_LARGE:
      return format("more than %llu bytes", (unsigned long long)err->val.too_large);
    case HOPPER_HANDLER_EMIT_EMIT_ERROR_NO_DELAY_RELAY:
      return format("no delay relay");
    default:
      return format("invalid record: %.*s", (int)err->val.invalid.len,
                    (const char *)err->val.invalid.ptr);
  }
}

// The order is closed: publish the service's record of it.
static void announce(handler_outcome_t *ret, const char *order, const char *topic,
                     const answer_t *answer) {
  hopper_handler_emit_header_t header;
  handler_string_set(&header.key, "content-type");
  header.value.ptr = (uint8_t *)"application/json";
  header.value.len = strlen("application/json");
  hopper_handler_emit_outgoing_t record = {
      .key = {.is_some = true, .val = {(uint8_t *)order, strlen(order)}},
      .payload = {.is_some = true, .val = {answer->body, answer->len}},
      .headers = {&header, 1},
      .delay_ms = {.is_some = false},
  };
  handler_string_set(&record.topic, topic);
  handler_string_t id;
  hopper_handler_emit_emit_error_t err;
  if (hopper_handler_emit_publish(&record, &id, &err)) {
    char *line = format("Closed unpaid order %s; announced it on %s as %.*s.", order, topic,
                        (int)id.len, (const char *)id.ptr);
    log_line(HOPPER_HANDLER_LOG_LEVEL_INFO, line);
    free(line);
    handler_string_free(&id);
    ret->tag = HOPPER_HANDLER_TYPES_OUTCOME_OK;
  } else {
    char *why = refused(&err);
    hopper_handler_emit_emit_error_free(&err);
    fatal(ret, format("cannot announce order %s on %s: %s", order, topic, why));
    free(why);
  }
}

// 409: the service would not close the order; its status says why.
static void nothing_to_close(handler_outcome_t *ret, const char *order,
                             const answer_t *answer) {
  char error[256];
  char *status = NULL;
  json_string_field(answer->body, answer->len, "status", &status, error, sizeof error);
  const char *s = status ? status : "";
  if (strcmp(s, "paid") == 0 || strcmp(s, "cancelled") == 0) {
    char *line = format("Order %s is %s, nothing to close.", order, s);
    log_line(HOPPER_HANDLER_LOG_LEVEL_INFO, line);
    free(line);
    ret->tag = HOPPER_HANDLER_TYPES_OUTCOME_OK;
  } else {
    fatal(ret, format("order %s has unknown status `%s`", order, s));
  }
  free(status);
}

static void handle(handler_message_t *message, handler_outcome_t *ret) {
  static const uint8_t empty[1];
  const uint8_t *payload = message->payload.is_some ? message->payload.val.ptr : empty;
  size_t len = message->payload.is_some ? message->payload.val.len : 0;
  char error[256];
  char *order = NULL;
  if (!json_string_field(payload, len, "order_id", &order, error, sizeof error)) {
    fatal(ret, format("payload is not an order: %s", error));
    return;
  }
  char *base = config_value("order-service");
  char *topic = config_value("closed-topic");
  if (topic == NULL) topic = format("orders.closed");
  url_t url;
  answer_t answer = {0};
  char detail[128];
  if (base == NULL) {
    fatal(ret, format("route config sets no `order-service` URL"));
  } else if (!close_url(base, order, &url)) {
    fatal(ret, format("`order-service` is not an http(s) URL: `%s`", base));
  } else {
    if (!post(&url, &answer, detail, sizeof detail)) {
      char *line = format("Order service unreachable closing order %s: %s.", order, detail);
      log_line(HOPPER_HANDLER_LOG_LEVEL_WARN, line);
      free(line);
      fail(ret, HOPPER_HANDLER_TYPES_OUTCOME_RETRYABLE, format("order service unreachable"));
    } else if (answer.status == 200) {
      announce(ret, order, topic, &answer);
    } else if (answer.status == 409) {
      nothing_to_close(ret, order, &answer);
    } else if (answer.status == 404) {
      fatal(ret, format("order %s is unknown to the order service", order));
    } else if (answer.status >= 500 && answer.status <= 599) {
      char *reason = format("order service unavailable (HTTP %u)", (unsigned)answer.status);
      char *line = format("Order service unavailable (HTTP %u) closing order %s.",
                          (unsigned)answer.status, order);
      log_line(HOPPER_HANDLER_LOG_LEVEL_WARN, line);
      free(line);
      fail(ret, HOPPER_HANDLER_TYPES_OUTCOME_RETRYABLE, reason);
    } else {
      fatal(ret, format("order service answered HTTP %u closing order %s",
                        (unsigned)answer.status, order));
    }
    answer_free(&answer);
    url_free(&url);
  }
  free(base);
  free(topic);
  free(order);
}

// The generated export: the message is ours to free.
void exports_handler_handle(handler_message_t *message, handler_outcome_t *ret) {
  handle(message, ret);
  hopper_handler_types_message_free(message);
}
