// One call to the order service through `hopper:handler/http.fetch`, with
// wit-bindgen's C bindings of the handler world.
#ifndef SERVICE_H
#define SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
  bool https;
  char *authority;
  char *path;
} url_t;

typedef struct {
  uint16_t status;
  uint8_t *body;
  size_t len;
} answer_t;

// `{base}/orders/{order}/close`, the order id percent-encoded as one path
// segment. False when `base` is not `http(s)://authority[/prefix]`.
bool close_url(const char *base, const char *order, url_t *url);
void url_free(url_t *url);

// POST with an empty body. False when no answer came (refused, timed out,
// denied by the route's grants); `detail` then says why.
bool post(const url_t *url, answer_t *answer, char *detail, size_t detail_len);
void answer_free(answer_t *answer);

#endif
