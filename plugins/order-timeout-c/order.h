// Reads an order event: `{"order_id": "...", "status": "...", "downstream": "..."}`.
#ifndef ORDER_H
#define ORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  char *order_id;
  char *status;
  // NULL when absent or null.
  char *downstream;
} order_t;

// Parses `payload` (the whole of it must be one JSON value). On success fills
// `order` with malloc'd, NUL-terminated strings and returns true; otherwise
// writes why into `error` and returns false.
bool order_parse(const uint8_t *payload, size_t len, order_t *order, char *error, size_t error_len);

void order_free(order_t *order);

#endif
