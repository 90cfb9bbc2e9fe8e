// The order-timeout handler in C, built with wit-bindgen's C generator,
// clang for wasm32-wasi and jco (core module to component).
//
// The same logic, log lines and failure reasons as the Rust handler in
// plugins/order-timeout/src/lib.rs; see there for the payload and verdicts.
// Only the text after `payload is not an order: ` differs, because it comes
// from a different JSON parser (order.c).
//
// handler.h is generated from wit/handler.wit by `wit-bindgen c`.

#include "handler.h"
#include "order.h"

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

static bool is(const char *value, const char *word) {
  return value != NULL && strcmp(value, word) == 0;
}

// The `order-service` config value, or "orders".
static char *order_service(void) {
  handler_string_t key, value;
  handler_string_set(&key, "order-service");
  if (!hopper_handler_config_get(&key, &value)) return format("orders");
  char *out = format("%.*s", (int)value.len, (const char *)value.ptr);
  handler_string_free(&value);
  return out;
}

static void handle(handler_message_t *message, handler_outcome_t *ret) {
  static const uint8_t empty[1];
  const uint8_t *payload = message->payload.is_some ? message->payload.val.ptr : empty;
  size_t len = message->payload.is_some ? message->payload.val.len : 0;
  char error[256];
  order_t order;
  if (!order_parse(payload, len, &order, error, sizeof error)) {
    fatal(ret, format("payload is not an order: %s", error));
    return;
  }
  char *service = order_service();

  if (is(order.status, "paid") || is(order.status, "cancelled") || is(order.status, "closed")) {
    char *line = format("Order %s is %s, nothing to close.", order.order_id, order.status);
    log_line(HOPPER_HANDLER_LOG_LEVEL_INFO, line);
    free(line);
    ret->tag = HOPPER_HANDLER_TYPES_OUTCOME_OK;
  } else if (is(order.status, "pending") || is(order.status, "unpaid")) {
    bool unavailable = false;
    if (is(order.downstream, "down")) {
      unavailable = true;
    } else if (is(order.downstream, "flaky")) {
      unavailable = message->attempt < 3;
    }
    if (unavailable) {
      char *line = format("Service %s unavailable closing order %s on attempt %u.", service,
                          order.order_id, (unsigned)message->attempt);
      log_line(HOPPER_HANDLER_LOG_LEVEL_WARN, line);
      free(line);
      fail(ret, HOPPER_HANDLER_TYPES_OUTCOME_RETRYABLE, format("%s service unavailable", service));
    } else {
      char *line = format("Closed unpaid order %s via %s.", order.order_id, service);
      log_line(HOPPER_HANDLER_LOG_LEVEL_INFO, line);
      free(line);
      ret->tag = HOPPER_HANDLER_TYPES_OUTCOME_OK;
    }
  } else {
    fatal(ret, format("order %s has unknown status `%s`", order.order_id, order.status));
  }
  free(service);
  order_free(&order);
}

// The generated export: the message is ours to free.
void exports_handler_handle(handler_message_t *message, handler_outcome_t *ret) {
  handle(message, ret);
  handler_message_free(message);
}
