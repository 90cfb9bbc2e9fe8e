// One call to the order service, through `hopper:handler/http.fetch`: the
// request in, the whole answer out. What the bindings hand back is this
// code's to free.

#include "service.h"
#include "handler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *copy(const char *s, size_t len) {
  char *out = malloc(len + 1);
  if (out == NULL) abort();
  memcpy(out, s, len);
  out[len] = 0;
  return out;
}

bool close_url(const char *base, const char *order, url_t *url) {
  memset(url, 0, sizeof *url);
  const char *rest;
  if (strncmp(base, "http://", 7) == 0) {
    rest = base + 7;
  } else if (strncmp(base, "https://", 8) == 0) {
    url->https = true;
    rest = base + 8;
  } else {
    return false;
  }
  if (strpbrk(rest, "?#") != NULL) return false;
  const char *slash = strchr(rest, '/');
  size_t authority_len = slash ? (size_t)(slash - rest) : strlen(rest);
  if (authority_len == 0) return false;
  const char *prefix = rest + authority_len;
  size_t prefix_len = strlen(prefix);
  while (prefix_len > 0 && prefix[prefix_len - 1] == '/') prefix_len--;

  static const char unreserved[] = "-._~";
  size_t order_len = strlen(order);
  // Worst case: every byte of the id as %XX.
  char *path = malloc(prefix_len + sizeof "/orders/" + order_len * 3 + sizeof "/close");
  if (path == NULL) abort();
  char *p = path;
  memcpy(p, prefix, prefix_len);
  p += prefix_len;
  p += sprintf(p, "/orders/");
  for (const unsigned char *c = (const unsigned char *)order; *c; c++) {
    bool keep = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                (*c != 0 && strchr(unreserved, *c) != NULL);
    p += keep ? sprintf(p, "%c", *c) : sprintf(p, "%%%02X", *c);
  }
  sprintf(p, "/close");
  url->authority = copy(rest, authority_len);
  url->path = path;
  return true;
}

void url_free(url_t *url) {
  free(url->authority);
  free(url->path);
  memset(url, 0, sizeof *url);
}

void answer_free(answer_t *answer) {
  free(answer->body);
  memset(answer, 0, sizeof *answer);
}

bool post(const url_t *url, answer_t *answer, char *detail, size_t detail_len) {
  memset(answer, 0, sizeof *answer);
  size_t n = strlen(url->authority) + strlen(url->path) + sizeof "https://";
  char *full = malloc(n);
  if (full == NULL) abort();
  snprintf(full, n, "%s://%s%s", url->https ? "https" : "http", url->authority, url->path);
  // No headers, no body: zeroed lists and options.
  hopper_handler_http_request_t request;
  memset(&request, 0, sizeof request);
  handler_string_set(&request.method, "POST");
  handler_string_set(&request.url, full);
  hopper_handler_http_response_t response;
  hopper_handler_http_fetch_error_t error;
  bool ok = hopper_handler_http_fetch(&request, &response, &error);
  free(full);
  if (!ok) {
    snprintf(detail, detail_len, "fetch error %u", (unsigned)error.tag);
    hopper_handler_http_fetch_error_free(&error);
    return false;
  }
  answer->status = response.status;
  answer->len = response.body.len;
  answer->body = malloc(answer->len + 1);
  if (answer->body == NULL) abort();
  memcpy(answer->body, response.body.ptr, answer->len);
  answer->body[answer->len] = 0;
  hopper_handler_http_response_free(&response);
  return true;
}
