// {{name}}: a hopper handler. Hopper calls `handle` once per delivery of a
// Kafka message and routes the message on by the outcome.
//
// handler.h is generated from wit/handler.wit by `wit-bindgen c` (build.sh).

#include "handler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void exports_handler_handle(handler_message_t *message, handler_outcome_t *ret) {
  if (!message->payload.is_some) {
    ret->tag = HOPPER_HANDLER_TYPES_OUTCOME_FATAL;
    handler_string_dup(&ret->val.fatal.reason, "a tombstone has nothing to handle");
    ret->val.fatal.retry_after_ms.is_some = false;
    hopper_handler_types_message_free(message);
    return;
  }
  handler_string_t key, value;
  handler_string_set(&key, "greeting");
  char greeting[64] = "Handled";
  if (hopper_handler_config_get(&key, &value)) {
    snprintf(greeting, sizeof greeting, "%.*s", (int)value.len, (const char *)value.ptr);
    handler_string_free(&value);
  }
  char line[256];
  snprintf(line, sizeof line, "%s message %.*s (%zu bytes) on attempt %u.", greeting,
           (int)message->id.len, (const char *)message->id.ptr, message->payload.val.len,
           (unsigned)message->attempt);
  handler_string_t text;
  handler_string_set(&text, line);
  hopper_handler_log_log(HOPPER_HANDLER_LOG_LEVEL_INFO, &text);
  ret->tag = HOPPER_HANDLER_TYPES_OUTCOME_OK;
  hopper_handler_types_message_free(message);
}
