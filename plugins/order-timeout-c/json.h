// A small strict JSON reader: picks one string field out of an object, the
// way serde_json reads a one-field struct (unknown fields are checked and
// skipped; a duplicate, missing or mistyped field is an error).
#ifndef JSON_H
#define JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Parses `text` (the whole of it must be one JSON object) and sets `*out` to
// a malloc'd, NUL-terminated copy of its string field `name`. On failure
// writes why into `error` and returns false; `*out` is then NULL.
bool json_string_field(const uint8_t *text, size_t len, const char *name, char **out,
                       char *error, size_t error_len);

#endif
