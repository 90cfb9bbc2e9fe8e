// A small strict JSON reader (RFC 8259), enough to pick a string field out
// of one object and to reject anything that is not valid JSON.

#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Nesting deeper than this is refused, as serde_json does at 128.
#define MAX_DEPTH 128

typedef struct {
  const uint8_t *start, *p, *end;
  char *error;
  size_t error_len;
  bool failed;
} reader;

// A growable byte buffer for decoded strings.
typedef struct {
  char *data;
  size_t len, cap;
} buffer;

static bool fail(reader *r, const char *fmt, ...) {
  if (!r->failed) {
    char what[160];
    va_list args;
    va_start(args, fmt);
    vsnprintf(what, sizeof what, fmt, args);
    va_end(args);
    snprintf(r->error, r->error_len, "%s at byte %zu", what, (size_t)(r->p - r->start));
    r->failed = true;
  }
  return false;
}

static bool push(buffer *b, uint8_t byte) {
  if (b == NULL) return true;
  if (b->len + 1 >= b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 32;
    char *data = realloc(b->data, cap);
    if (data == NULL) return false;
    b->data = data;
    b->cap = cap;
  }
  b->data[b->len++] = (char)byte;
  b->data[b->len] = 0;
  return true;
}

static bool push_utf8(buffer *b, uint32_t c) {
  if (c < 0x80) return push(b, c);
  if (c < 0x800) return push(b, 0xC0 | (c >> 6)) && push(b, 0x80 | (c & 0x3F));
  if (c < 0x10000)
    return push(b, 0xE0 | (c >> 12)) && push(b, 0x80 | ((c >> 6) & 0x3F)) &&
           push(b, 0x80 | (c & 0x3F));
  return push(b, 0xF0 | (c >> 18)) && push(b, 0x80 | ((c >> 12) & 0x3F)) &&
         push(b, 0x80 | ((c >> 6) & 0x3F)) && push(b, 0x80 | (c & 0x3F));
}

static void skip_ws(reader *r) {
  while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static bool hex4(reader *r, uint32_t *out) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    if (r->p >= r->end) return fail(r, "EOF while parsing a string");
    uint8_t c = *r->p++;
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else return fail(r, "invalid escape");
  }
  *out = v;
  return true;
}

// Length of the valid UTF-8 sequence at p (1-4), or 0.
static size_t utf8_len(const uint8_t *p, const uint8_t *end) {
  uint8_t c = p[0];
  size_t n;
  uint32_t min;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) n = 2, min = 0x80;
  else if ((c & 0xF0) == 0xE0) n = 3, min = 0x800;
  else if ((c & 0xF8) == 0xF0) n = 4, min = 0x10000;
  else return 0;
  if ((size_t)(end - p) < n) return 0;
  uint32_t v = c & (0x7F >> n);
  for (size_t i = 1; i < n; i++) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (p[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  return n;
}

// Reads a string starting at its opening quote; decodes it into `out` when
// `out` is not NULL.
static bool read_string(reader *r, buffer *out) {
  r->p++;
  while (true) {
    if (r->p >= r->end) return fail(r, "EOF while parsing a string");
    uint8_t c = *r->p;
    if (c == '"') {
      r->p++;
      return true;
    }
    if (c < 0x20) return fail(r, "control character (\\u0000-\\u001F) found while parsing a string");
    if (c == '\\') {
      r->p++;
      if (r->p >= r->end) return fail(r, "EOF while parsing a string");
      uint8_t e = *r->p++;
      uint32_t cp;
      switch (e) {
        case '"': case '\\': case '/': cp = e; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
          if (!hex4(r, &cp)) return false;
          if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(r, "lone leading surrogate in hex escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low;
            if (r->end - r->p < 2 || r->p[0] != '\\' || r->p[1] != 'u')
              return fail(r, "unexpected end of hex escape");
            r->p += 2;
            if (!hex4(r, &low)) return false;
            if (low < 0xDC00 || low > 0xDFFF) return fail(r, "lone leading surrogate in hex escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          break;
        default:
          return fail(r, "invalid escape");
      }
      if (out && !push_utf8(out, cp)) return fail(r, "out of memory");
      continue;
    }
    size_t n = utf8_len(r->p, r->end);
    if (n == 0) return fail(r, "invalid unicode code point");
    for (size_t i = 0; i < n; i++)
      if (out && !push(out, r->p[i])) return fail(r, "out of memory");
    r->p += n;
  }
}

static bool read_value(reader *r, int depth);

static bool expect_literal(reader *r, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n) != 0) return fail(r, "expected value");
  r->p += n;
  return true;
}

static bool is_digit(reader *r) { return r->p < r->end && *r->p >= '0' && *r->p <= '9'; }

static bool read_number(reader *r) {
  if (*r->p == '-') r->p++;
  if (!is_digit(r)) return fail(r, "invalid number");
  if (*r->p == '0') r->p++;
  else while (is_digit(r)) r->p++;
  if (r->p < r->end && *r->p == '.') {
    r->p++;
    if (!is_digit(r)) return fail(r, "invalid number");
    while (is_digit(r)) r->p++;
  }
  if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
    r->p++;
    if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
    if (!is_digit(r)) return fail(r, "invalid number");
    while (is_digit(r)) r->p++;
  }
  return true;
}

// Reads (and discards) any value.
static bool read_value(reader *r, int depth) {
  skip_ws(r);
  if (r->p >= r->end) return fail(r, "EOF while parsing a value");
  if (depth > MAX_DEPTH) return fail(r, "recursion limit exceeded");
  uint8_t c = *r->p;
  if (c == '"') return read_string(r, NULL);
  if (c == 't') return expect_literal(r, "true");
  if (c == 'f') return expect_literal(r, "false");
  if (c == 'n') return expect_literal(r, "null");
  if (c == '-' || (c >= '0' && c <= '9')) return read_number(r);
  if (c == '[' || c == '{') {
    uint8_t close = c == '[' ? ']' : '}';
    r->p++;
    skip_ws(r);
    if (r->p < r->end && *r->p == close) {
      r->p++;
      return true;
    }
    while (true) {
      if (close == '}') {
        skip_ws(r);
        if (r->p >= r->end) return fail(r, "EOF while parsing an object");
        if (*r->p != '"') return fail(r, "key must be a string");
        if (!read_string(r, NULL)) return false;
        skip_ws(r);
        if (r->p >= r->end || *r->p != ':') return fail(r, "expected `:`");
        r->p++;
      }
      if (!read_value(r, depth + 1)) return false;
      skip_ws(r);
      if (r->p >= r->end) return fail(r, close == ']' ? "EOF while parsing a list" : "EOF while parsing an object");
      if (*r->p == close) {
        r->p++;
        return true;
      }
      if (*r->p != ',') return fail(r, close == ']' ? "expected `,` or `]`" : "expected `,` or `}`");
      r->p++;
    }
  }
  return fail(r, "expected value");
}

static const char *type_name(uint8_t c) {
  switch (c) {
    case '"': return "string";
    case '[': return "sequence";
    case 't': case 'f': return "boolean";
    case 'n': return "null";
    default: return "number";
  }
}

// Reads a field that must be a string.
static bool read_field(reader *r, const char *name, char **out) {
  skip_ws(r);
  if (r->p >= r->end) return fail(r, "EOF while parsing a value");
  if (*r->p != '"') {
    const uint8_t *at = r->p;
    if (!read_value(r, 1)) return false;
    return fail(r, "invalid type: %s, expected a string for `%s`", type_name(*at), name);
  }
  buffer b = {0};
  if (!read_string(r, &b)) {
    free(b.data);
    return false;
  }
  if (b.data == NULL && !push(&b, 0)) return fail(r, "out of memory");
  free(*out);
  *out = b.data;
  return true;
}

bool json_string_field(const uint8_t *text, size_t len, const char *name, char **out,
                       char *error, size_t error_len) {
  reader r = {text, text, text + len, error, error_len, false};
  *out = NULL;
  bool seen = false;
  skip_ws(&r);
  if (r.p >= r.end) {
    fail(&r, "EOF while parsing a value");
    goto bad;
  }
  if (*r.p != '{') {
    const uint8_t *at = r.p;
    if (!read_value(&r, 0)) goto bad;
    r.p = at;
    fail(&r, "invalid type: %s, expected an object", type_name(*at));
    goto bad;
  }
  r.p++;
  skip_ws(&r);
  if (r.p < r.end && *r.p == '}') {
    r.p++;
  } else {
    while (true) {
      skip_ws(&r);
      if (r.p >= r.end) {
        fail(&r, "EOF while parsing an object");
        goto bad;
      }
      if (*r.p != '"') {
        fail(&r, "key must be a string");
        goto bad;
      }
      buffer key = {0};
      if (!read_string(&r, &key)) {
        free(key.data);
        goto bad;
      }
      skip_ws(&r);
      if (r.p >= r.end || *r.p != ':') {
        free(key.data);
        fail(&r, "expected `:`");
        goto bad;
      }
      r.p++;
      bool ok;
      if (strcmp(key.data ? key.data : "", name) != 0) {
        ok = read_value(&r, 1);
      } else if (seen) {
        ok = fail(&r, "duplicate field `%s`", name);
      } else {
        seen = true;
        ok = read_field(&r, name, out);
      }
      free(key.data);
      if (!ok) goto bad;
      skip_ws(&r);
      if (r.p >= r.end) {
        fail(&r, "EOF while parsing an object");
        goto bad;
      }
      if (*r.p == '}') {
        r.p++;
        break;
      }
      if (*r.p != ',') {
        fail(&r, "expected `,` or `}`");
        goto bad;
      }
      r.p++;
    }
  }
  skip_ws(&r);
  if (r.p < r.end) {
    fail(&r, "trailing characters");
    goto bad;
  }
  if (!seen) {
    fail(&r, "missing field `%s`", name);
    goto bad;
  }
  return true;
bad:
  free(*out);
  *out = NULL;
  return false;
}
