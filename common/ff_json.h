/* ff_json.h — the one JSON reader helper and the canonical writer.
 *
 * Reading: ff_json_parse/ff_json_load check what cJSON does not (size, NUL bytes, UTF-8, nesting
 * depth, duplicate keys, trailing bytes) and report syntax errors with line and column. Format
 * readers then walk objects with ff_jobj: each accessor marks its key as known, checks type and
 * range and reports problems with the JSON path; ff_jobj_close reports every key nobody asked for
 * (a typo, usually) with the closest known key as a hint.
 *
 * Writing: ff_json_write renders a cJSON tree canonically (insertion key order, shortest
 * round-trip numbers, two-space indent, one-line scalar arrays and flat array elements, trailing
 * newline), so the same data always gives the same bytes. ff_write_file_atomic writes through a
 * temporary file and rename(), so an error never leaves a partial or truncated output. */
#ifndef FF_JSON_H
#define FF_JSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ff_diag.h"
#include "ff_status.h"

#define FF_JSON_MAX_BYTES (64u << 20)
#define FF_JSON_MAX_DEPTH 64
#define FF_PATH_MAX 256
#define FF_JOBJ_MAX_KEYS 48

/* ---- reading ---------------------------------------------------------------------------- */

ff_status ff_json_parse(const char *text, size_t len, ff_diag *d, cJSON **out);
ff_status ff_json_load(const char *file, ff_diag *d, cJSON **out);
/* Read a whole file (at most FF_JSON_MAX_BYTES); *out is NUL-terminated, caller frees. */
ff_status ff_read_file(const char *file, ff_diag *d, char **out, size_t *len);
/* The same with another size limit, or none to speak of (checkpoints). */
ff_status ff_read_file_limit(const char *file, ff_diag *d, char **out, size_t *len, size_t max);
ff_status ff_read_file_any(const char *file, ff_diag *d, char **out, size_t *len);

/* A numeric interval; *_open excludes the end point. */
typedef struct ff_interval {
  double lo, hi;
  bool lo_open, hi_open;
} ff_interval;
#define FF_CLOSED(a, b) ((ff_interval){(a), (b), false, false})
#define FF_POSITIVE(b) ((ff_interval){0, (b), true, false}) /* (0, b] */

/* Value checks for one JSON value at `path`; each reports and returns false on failure. */
bool ff_json_as_int(ff_diag *d, const cJSON *v, const char *path, int64_t lo, int64_t hi,
                    int64_t *out);
bool ff_json_as_num(ff_diag *d, const cJSON *v, const char *path, ff_interval iv, double *out);
bool ff_json_as_name(ff_diag *d, const cJSON *v, const char *path, char *out /* 65 bytes */);
bool ff_json_as_span(ff_diag *d, const cJSON *v, const char *path, int64_t lo, int64_t hi,
                     int64_t out[2]);

typedef struct ff_jobj {
  const cJSON *json;
  ff_diag *diag;
  char path[FF_PATH_MAX]; /* "" for the root */
  const char *known[FF_JOBJ_MAX_KEYS];
  int n_known;
  bool is_object;
} ff_jobj;

/* Open `v` as an object; false (and reported) when it is not one. */
bool ff_jobj_open(ff_jobj *o, ff_diag *d, const cJSON *v, const char *path);
/* Path of a member: "path.key" (or "key" at the root). */
void ff_jobj_path(const ff_jobj *o, const char *key, char *out, size_t cap);
/* The member, or NULL; when required, a missing member is reported. Marks the key known. */
const cJSON *ff_jobj_get(ff_jobj *o, const char *key, bool required);
/* Typed members. Each returns true when the member is present and valid; when it is absent and
 * not required, *out keeps the caller's default. `ok` in the callers tracks validity. */
bool ff_jobj_int(ff_jobj *o, const char *key, bool required, int64_t lo, int64_t hi,
                 int64_t *out);
bool ff_jobj_num(ff_jobj *o, const char *key, bool required, ff_interval iv, double *out);
bool ff_jobj_bool(ff_jobj *o, const char *key, bool required, bool *out);
bool ff_jobj_name(ff_jobj *o, const char *key, bool required, char *out /* 65 bytes */);
/* A string of at most max_len bytes, duplicated into *out (caller frees). */
bool ff_jobj_text(ff_jobj *o, const char *key, bool required, size_t max_len, char **out);
/* One of `choices` (NULL-terminated); *out is its index. */
bool ff_jobj_enum(ff_jobj *o, const char *key, bool required, const char *const *choices,
                  int *out);
bool ff_jobj_span(ff_jobj *o, const char *key, bool required, int64_t lo, int64_t hi,
                  int64_t out[2]);
/* An array of min..max elements; NULL when absent or wrong. */
const cJSON *ff_jobj_array(ff_jobj *o, const char *key, bool required, int min, int max);
/* Report members no accessor asked for. */
void ff_jobj_close(ff_jobj *o);

/* Is `s` a valid name: 1..64 chars of [A-Za-z0-9._-]? */
bool ff_name_valid(const char *s);
/* "a, b, c" of a NULL-terminated list, for messages. */
void ff_join_choices(const char *const *choices, char *out, size_t cap);

/* ---- writing ---------------------------------------------------------------------------- */

typedef struct ff_buf {
  char *data;
  size_t len, cap;
  bool failed; /* an allocation failed; the content is incomplete */
} ff_buf;

void ff_buf_free(ff_buf *b);
void ff_buf_put(ff_buf *b, const char *s, size_t n);
void ff_buf_puts(ff_buf *b, const char *s);
void ff_buf_printf(ff_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Shortest decimal that strtod reads back to exactly x (integers without a fraction). */
void ff_format_double(double x, char out[32]);
/* Render a tree canonically into b. */
void ff_json_write(const cJSON *root, ff_buf *b);
/* Write data to file via a temporary in the same directory, fsync and rename. "-" is stdout. */
ff_status ff_write_file_atomic(const char *file, const char *data, size_t len, ff_diag *d);
/* A file written a piece at a time, in place of `file` only once it is whole: a temporary beside
 * it takes the bytes (appended, or rewritten at an offset already written), and commit fsyncs
 * and renames it over `file`. The first error is kept and reported by commit, which then leaves
 * `file` as it was; discard drops the temporary. Either frees the handle. */
typedef struct ff_atomic_file ff_atomic_file;
ff_atomic_file *ff_atomic_open(const char *file, ff_diag *d);
void ff_atomic_write(ff_atomic_file *f, const void *data, size_t len);
void ff_atomic_write_at(ff_atomic_file *f, const void *data, size_t len, int64_t offset);
ff_status ff_atomic_commit(ff_atomic_file *f, ff_diag *d);
void ff_atomic_discard(ff_atomic_file *f);
/* Render `root` canonically (ff_json_write) and write it with ff_write_file_atomic; a document
 * that cannot be rendered (out of memory) is not written. */
ff_status ff_write_json_atomic(const char *file, const cJSON *root, ff_diag *d);

/* FNV-1a 64-bit hash, for input digests; _update goes on from h (FF_FNV1A64_INIT at the start)
 * over more bytes, so a stream can be hashed a piece at a time. */
#define FF_FNV1A64_INIT 14695981039346656037ull
uint64_t ff_fnv1a64(const void *data, size_t len);
uint64_t ff_fnv1a64_update(uint64_t h, const void *data, size_t len);

#endif
