// One call to the order service. Every resource the bindings hand out is
// owned by this code and dropped here, children before parents (a stream
// before its body, a body before its response): a handle left behind lives
// on in the instance, which hopper keeps warm across calls.

#include "service.h"
#include "handler_http.h"

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

// Reads the whole body of `response` into `answer`.
static bool read_body(wasi_http_types_borrow_incoming_response_t response, answer_t *answer,
                      char *detail, size_t detail_len) {
  wasi_http_types_own_incoming_body_t body;
  if (!wasi_http_types_method_incoming_response_consume(response, &body)) {
    snprintf(detail, detail_len, "no response body");
    return false;
  }
  wasi_http_types_own_input_stream_t stream;
  if (!wasi_http_types_method_incoming_body_stream(wasi_http_types_borrow_incoming_body(body),
                                                   &stream)) {
    wasi_http_types_incoming_body_drop_own(body);
    snprintf(detail, detail_len, "no response body");
    return false;
  }
  bool ok = true;
  while (true) {
    handler_http_list_u8_t chunk;
    wasi_io_streams_stream_error_t err;
    if (!wasi_io_streams_method_input_stream_blocking_read(
            wasi_io_streams_borrow_input_stream(stream), 64 * 1024, &chunk, &err)) {
      if (err.tag == WASI_IO_STREAMS_STREAM_ERROR_LAST_OPERATION_FAILED) {
        wasi_io_error_error_drop_own(err.val.last_operation_failed);
        snprintf(detail, detail_len, "reading the response failed");
        ok = false;
      }
      break;  // closed: the whole body is read
    }
    uint8_t *grown = realloc(answer->body, answer->len + chunk.len + 1);
    if (grown == NULL) abort();
    memcpy(grown + answer->len, chunk.ptr, chunk.len);
    answer->body = grown;
    answer->len += chunk.len;
    handler_http_list_u8_free(&chunk);
  }
  wasi_io_streams_input_stream_drop_own(stream);
  wasi_http_types_future_trailers_drop_own(wasi_http_types_static_incoming_body_finish(body));
  return ok;
}

bool post(const url_t *url, answer_t *answer, char *detail, size_t detail_len) {
  memset(answer, 0, sizeof *answer);
  wasi_http_types_own_outgoing_request_t request =
      wasi_http_types_constructor_outgoing_request(wasi_http_types_constructor_fields());
  wasi_http_types_borrow_outgoing_request_t borrowed =
      wasi_http_types_borrow_outgoing_request(request);
  wasi_http_types_method_t method = {.tag = WASI_HTTP_TYPES_METHOD_POST};
  wasi_http_types_scheme_t scheme = {
      .tag = url->https ? WASI_HTTP_TYPES_SCHEME_HTTPS : WASI_HTTP_TYPES_SCHEME_HTTP};
  handler_http_string_t authority, path;
  handler_http_string_set(&authority, url->authority);
  handler_http_string_set(&path, url->path);
  if (!wasi_http_types_method_outgoing_request_set_method(borrowed, &method) ||
      !wasi_http_types_method_outgoing_request_set_scheme(borrowed, &scheme) ||
      !wasi_http_types_method_outgoing_request_set_authority(borrowed, &authority) ||
      !wasi_http_types_method_outgoing_request_set_path_with_query(borrowed, &path)) {
    wasi_http_types_outgoing_request_drop_own(request);
    snprintf(detail, detail_len, "invalid request to %s%s", url->authority, url->path);
    return false;
  }

  // `handle` takes ownership of the request.
  wasi_http_outgoing_handler_own_future_incoming_response_t future;
  wasi_http_outgoing_handler_error_code_t code;
  if (!wasi_http_outgoing_handler_handle(request, NULL, &future, &code)) {
    snprintf(detail, detail_len, "error code %u", (unsigned)code.tag);
    wasi_http_outgoing_handler_error_code_free(&code);
    return false;
  }
  wasi_http_types_borrow_future_incoming_response_t pending =
      wasi_http_types_borrow_future_incoming_response(future);
  wasi_io_poll_own_pollable_t ready =
      wasi_http_types_method_future_incoming_response_subscribe(pending);
  wasi_io_poll_method_pollable_block(wasi_io_poll_borrow_pollable(ready));
  wasi_io_poll_pollable_drop_own(ready);

  wasi_http_types_result_result_own_incoming_response_error_code_void_t got;
  bool ok = false;
  if (!wasi_http_types_method_future_incoming_response_get(pending, &got) || got.is_err) {
    snprintf(detail, detail_len, "the response was lost");
  } else if (got.val.ok.is_err) {
    snprintf(detail, detail_len, "error code %u", (unsigned)got.val.ok.val.err.tag);
    wasi_http_types_error_code_free(&got.val.ok.val.err);
  } else {
    wasi_http_types_own_incoming_response_t response = got.val.ok.val.ok;
    wasi_http_types_borrow_incoming_response_t borrowed_response =
        wasi_http_types_borrow_incoming_response(response);
    answer->status = wasi_http_types_method_incoming_response_status(borrowed_response);
    ok = read_body(borrowed_response, answer, detail, detail_len);
    wasi_http_types_incoming_response_drop_own(response);
  }
  wasi_http_types_future_incoming_response_drop_own(future);
  if (!ok) answer_free(answer);
  return ok;
}
