/* ff_json.c — strict JSON reading and canonical writing; see ff_json.h for the contract. */
#define _POSIX_C_SOURCE 200809L
#include "ff_json.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- loading ---------------------------------------------------------------------------- */

ff_status ff_read_file(const char *file, ff_diag *d, char **out, size_t *len) {
  return ff_read_file_limit(file, d, out, len, FF_JSON_MAX_BYTES);
}

ff_status ff_read_file_any(const char *file, ff_diag *d, char **out, size_t *len) {
  return ff_read_file_limit(file, d, out, len, (size_t)1 << 40);
}

ff_status ff_read_file_limit(const char *file, ff_diag *d, char **out, size_t *len, size_t max) {
  *out = NULL;
  *len = 0;
  FILE *f = fopen(file, "rb");
  if (!f) {
    ff_diag_error(d, NULL, "cannot open: %s", strerror(errno));
    return FF_ERR_INPUT;
  }
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    fclose(f);
    ff_diag_error(d, NULL, "is a directory, expected a JSON file");
    return FF_ERR_INPUT;
  }
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  if (!buf) {
    fclose(f);
    ff_diag_error(d, NULL, "out of memory reading the file");
    return FF_ERR_RUNTIME;
  }
  for (;;) {
    if (n + 1 >= cap) {
      if (cap > max) {
        free(buf);
        fclose(f);
        ff_diag_error(d, NULL, "file is larger than %zu MiB; inputs are limited to that size",
                      max >> 20);
        return FF_ERR_INPUT;
      }
      char *grown = realloc(buf, cap * 2);
      if (!grown) {
        free(buf);
        fclose(f);
        ff_diag_error(d, NULL, "out of memory reading the file");
        return FF_ERR_RUNTIME;
      }
      buf = grown;
      cap *= 2;
    }
    size_t got = fread(buf + n, 1, cap - 1 - n, f);
    n += got;
    if (got == 0) {
      if (ferror(f)) {
        int err = errno;
        free(buf);
        fclose(f);
        ff_diag_error(d, NULL, "read error: %s", strerror(err));
        return FF_ERR_INPUT;
      }
      break;
    }
  }
  fclose(f);
  if (n > max) {
    free(buf);
    ff_diag_error(d, NULL, "file is larger than %zu MiB; inputs are limited to that size",
                  max >> 20);
    return FF_ERR_INPUT;
  }
  buf[n] = '\0';
  *out = buf;
  *len = n;
  return FF_OK;
}

static void line_col(const char *text, size_t offset, int *line, int *col) {
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < offset; i++) {
    if (text[i] == '\n') {
      (*line)++;
      *col = 1;
    } else if (((unsigned char)text[i] & 0xC0) != 0x80) {
      (*col)++;
    }
  }
}

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 when invalid. */
static size_t utf8_sequence(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  if (c < 0x80)
    return 1;
  size_t need;
  unsigned cp;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (n < need)
    return 0;
  for (size_t i = 1; i < need; i++) {
    if ((s[i] & 0xC0) != 0x80)
      return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  if ((need == 3 && cp < 0x800) || (need == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
    return 0; /* overlong or beyond Unicode */
  if (cp >= 0xD800 && cp <= 0xDFFF)
    return 0; /* surrogate */
  return need;
}

/* Reject what cJSON would accept silently or choke on: NUL bytes, invalid UTF-8, raw control
 * characters in strings, \u0000 (which would cut a string short), numbers with leading zeros,
 * and nesting deeper than FF_JSON_MAX_DEPTH. *truncated tells whether the text ends inside a
 * string or an open object or array. */
static bool prescan(const char *text, size_t len, ff_diag *d, bool *truncated) {
  const unsigned char *s = (const unsigned char *)text;
  int depth = 0;
  bool in_string = false, escaped = false;
  int line, col;
  *truncated = false;
  for (size_t i = 0; i < len;) {
    unsigned c = s[i];
    if (c == 0) {
      line_col(text, i, &line, &col);
      ff_diag_error(d, NULL,
                    "line %d column %d (byte %zu): NUL byte; this looks like a binary file, "
                    "expected UTF-8 JSON",
                    line, col, i);
      return false;
    }
    size_t n = utf8_sequence(s + i, len - i);
    if (n == 0) {
      line_col(text, i, &line, &col);
      ff_diag_error(d, NULL, "line %d column %d (byte %zu): invalid UTF-8; files must be UTF-8",
                    line, col, i);
      return false;
    }
    if (in_string && escaped) {
      escaped = false; /* the escaped character: checked above as any byte, meaning aside */
    } else if (in_string) {
      if (c < 0x20) {
        line_col(text, i, &line, &col);
        ff_diag_error(d, NULL, "line %d column %d: control character 0x%02x inside a string "
                      "(write it as an escape such as \\n)", line, col, c);
        return false;
      }
      if (c == '\\') {
        if (i + 5 < len && s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0) {
          line_col(text, i, &line, &col);
          ff_diag_error(d, NULL, "line %d column %d: \\u0000 is not allowed in strings", line,
                        col);
          return false;
        }
        escaped = true;
      }
      if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > FF_JSON_MAX_DEPTH) {
        line_col(text, i, &line, &col);
        ff_diag_error(d, NULL, "line %d column %d: nesting deeper than %d levels", line, col,
                      FF_JSON_MAX_DEPTH);
        return false;
      }
    } else if (c == '}' || c == ']') {
      depth--;
    } else if (c == '0' && i + 1 < len && s[i + 1] >= '0' && s[i + 1] <= '9') {
      size_t j = i;
      if (j > 0 && s[j - 1] == '-')
        j--;
      unsigned prev = j > 0 ? s[j - 1] : ' ';
      if (!((prev >= '0' && prev <= '9') || prev == '.' || prev == 'e' || prev == 'E' ||
            prev == '+' || prev == '-')) {
        line_col(text, i, &line, &col);
        ff_diag_error(d, NULL, "line %d column %d: number with a leading zero (JSON numbers "
                      "do not start with 0 unless they are 0)", line, col);
        return false;
      }
    }
    i += n;
  }
  *truncated = in_string || depth > 0;
  return true;
}

/* A short, single-line excerpt of the text at offset, for syntax errors. */
static void excerpt(const char *text, size_t len, size_t offset, char *out, size_t cap) {
  size_t j = 0;
  for (size_t i = offset; i < len && j + 1 < cap && i < offset + 16; i++) {
    unsigned char c = (unsigned char)text[i];
    if (c == '\n' || c == '\r')
      break;
    if (c >= 0x80) { /* keep whole UTF-8 sequences only */
      size_t n = utf8_sequence((const unsigned char *)text + i, len - i);
      if (n == 0 || j + n + 1 > cap)
        break;
      memcpy(out + j, text + i, n);
      j += n;
      i += n - 1;
      continue;
    }
    out[j++] = c < 0x20 ? ' ' : (char)c;
  }
  out[j] = '\0';
}

static int cmp_cstr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void child_path(const char *path, const char *key, char *out, size_t cap) {
  if (path && *path)
    snprintf(out, cap, "%s.%s", path, key);
  else
    snprintf(out, cap, "%s", key);
}

static void index_path(const char *path, int index, char *out, size_t cap) {
  snprintf(out, cap, "%s[%d]", path && *path ? path : "", index);
}

/* Report the first duplicate key of every object in the tree. */
static bool check_duplicates(const cJSON *v, const char *path, ff_diag *d) {
  bool ok = true;
  if (cJSON_IsObject(v)) {
    int n = cJSON_GetArraySize(v);
    if (n > 1) {
      const char **names = malloc((size_t)n * sizeof *names);
      if (!names)
        return false;
      int i = 0;
      for (const cJSON *c = v->child; c; c = c->next)
        names[i++] = c->string;
      qsort(names, (size_t)n, sizeof *names, cmp_cstr);
      for (i = 1; i < n; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
          char p[FF_PATH_MAX];
          child_path(path, names[i], p, sizeof p);
          ff_diag_error(d, p, "duplicate key \"%s\"", names[i]);
          ok = false;
          break;
        }
      }
      free(names);
    }
    for (const cJSON *c = v->child; c; c = c->next) {
      char p[FF_PATH_MAX];
      child_path(path, c->string, p, sizeof p);
      ok = check_duplicates(c, p, d) && ok;
    }
  } else if (cJSON_IsArray(v)) {
    int i = 0;
    for (const cJSON *c = v->child; c; c = c->next, i++) {
      if (!cJSON_IsObject(c) && !cJSON_IsArray(c))
        continue;
      char p[FF_PATH_MAX];
      index_path(path, i, p, sizeof p);
      ok = check_duplicates(c, p, d) && ok;
    }
  }
  return ok;
}

ff_status ff_json_parse(const char *text, size_t len, ff_diag *d, cJSON **out) {
  *out = NULL;
  size_t first = 0;
  while (first < len && strchr(" \t\r\n", text[first]) && text[first])
    first++;
  if (first == len) {
    ff_diag_error(d, NULL, "file is empty; expected a JSON object with a \"format\" key");
    return FF_ERR_INPUT;
  }
  bool truncated = false;
  if (!prescan(text, len, d, &truncated))
    return FF_ERR_INPUT;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
  int line, col;
  if (!root) {
    if (truncated) {
      line_col(text, len, &line, &col);
      ff_diag_error(d, NULL, "line %d column %d: unexpected end of file; the JSON is truncated",
                    line, col);
      return FF_ERR_INPUT;
    }
    const char *at = end ? end : cJSON_GetErrorPtr();
    size_t offset = at && at >= text && at <= text + len ? (size_t)(at - text) : len;
    /* Where cJSON expected a key it reports one byte past the offending token. */
    if (offset > 0 && offset <= len && !strchr(" \t\r\n,:[{", text[offset - 1]))
      offset--;
    line_col(text, offset, &line, &col);
    if (offset >= len) {
      ff_diag_error(d, NULL, "line %d column %d: unexpected end of file; the JSON is truncated",
                    line, col);
    } else {
      char near[64];
      excerpt(text, len, offset, near, sizeof near);
      ff_diag_error(d, NULL, "line %d column %d: JSON syntax error near '%s'", line, col, near);
    }
    return FF_ERR_INPUT;
  }
  size_t offset = (size_t)(end - text);
  while (offset < len && strchr(" \t\r\n", text[offset]) && text[offset])
    offset++;
  if (offset < len) {
    line_col(text, offset, &line, &col);
    ff_diag_error(d, NULL, "line %d column %d: unexpected text after the JSON value", line, col);
    cJSON_Delete(root);
    return FF_ERR_INPUT;
  }
  if (!check_duplicates(root, "", d)) {
    cJSON_Delete(root);
    return FF_ERR_INPUT;
  }
  *out = root;
  return FF_OK;
}

ff_status ff_json_load(const char *file, ff_diag *d, cJSON **out) {
  char *text;
  size_t len;
  *out = NULL;
  FF_CHECK(ff_read_file(file, d, &text, &len));
  ff_status st = ff_json_parse(text, len, d, out);
  free(text);
  return st;
}

/* ---- value checks ----------------------------------------------------------------------- */

static const char *type_name(const cJSON *v) {
  if (cJSON_IsString(v))
    return "a string";
  if (cJSON_IsNumber(v))
    return "a number";
  if (cJSON_IsBool(v))
    return "a boolean";
  if (cJSON_IsNull(v))
    return "null";
  if (cJSON_IsArray(v))
    return "an array";
  if (cJSON_IsObject(v))
    return "an object";
  return "an invalid value";
}

/* A short rendering of a scalar for messages: "\"abc\"", 12, true. */
static void preview(const cJSON *v, char *out, size_t cap) {
  if (cJSON_IsString(v)) {
    size_t j = 0;
    const char *s = v->valuestring;
    if (cap < 8) {
      out[0] = '\0';
      return;
    }
    out[j++] = '"';
    for (size_t i = 0; s[i] && j + 6 < cap; i++) {
      unsigned char c = (unsigned char)s[i];
      if (c < 0x20 || c == '"' || c == '\\')
        j += (size_t)snprintf(out + j, cap - j, "\\x%02x", c);
      else
        out[j++] = (char)c;
      if (i >= 40 && s[i + 1] && ((unsigned char)s[i + 1] & 0xC0) != 0x80) {
        memcpy(out + j, "...", 3);
        j += 3;
        break;
      }
    }
    out[j++] = '"';
    out[j] = '\0';
  } else if (cJSON_IsNumber(v)) {
    char num[32];
    ff_format_double(v->valuedouble, num);
    snprintf(out, cap, "%s", num);
  } else if (cJSON_IsBool(v)) {
    snprintf(out, cap, "%s", cJSON_IsTrue(v) ? "true" : "false");
  } else {
    snprintf(out, cap, "%s", type_name(v));
  }
}

static void report_type(ff_diag *d, const cJSON *v, const char *path, const char *expected) {
  char got[80];
  preview(v, got, sizeof got);
  if (cJSON_IsString(v) || cJSON_IsNumber(v) || cJSON_IsBool(v))
    ff_diag_error(d, path, "expected %s, got %s %s", expected, type_name(v), got);
  else
    ff_diag_error(d, path, "expected %s, got %s", expected, type_name(v));
}

bool ff_json_as_int(ff_diag *d, const cJSON *v, const char *path, int64_t lo, int64_t hi,
                    int64_t *out) {
  if (!cJSON_IsNumber(v)) {
    report_type(d, v, path, "an integer");
    return false;
  }
  double x = v->valuedouble;
  char num[32];
  ff_format_double(x, num);
  if (!isfinite(x)) {
    ff_diag_error(d, path, "%s is not a finite number", num);
    return false;
  }
  if (x != floor(x)) {
    ff_diag_error(d, path, "%s is not an integer", num);
    return false;
  }
  if (x < (double)lo || x > (double)hi) {
    ff_diag_error(d, path, "%s is out of range (expected an integer from %lld to %lld)", num,
                  (long long)lo, (long long)hi);
    return false;
  }
  *out = (int64_t)x;
  return true;
}

static void interval_text(ff_interval iv, char *out, size_t cap) {
  char lo[32], hi[32];
  ff_format_double(iv.lo, lo);
  ff_format_double(iv.hi, hi);
  if (iv.hi >= 1e300) /* open-ended: say so rather than print a sentinel */
    snprintf(out, cap, "%s %s", iv.lo_open ? ">" : ">=", lo);
  else
    snprintf(out, cap, "%c%s, %s%c", iv.lo_open ? '(' : '[', lo, hi, iv.hi_open ? ')' : ']');
}

bool ff_json_as_num(ff_diag *d, const cJSON *v, const char *path, ff_interval iv, double *out) {
  if (!cJSON_IsNumber(v)) {
    report_type(d, v, path, "a number");
    return false;
  }
  double x = v->valuedouble;
  char num[32], range[80];
  ff_format_double(x, num);
  if (!isfinite(x)) {
    ff_diag_error(d, path, "%s is not a finite number", num);
    return false;
  }
  bool below = iv.lo_open ? x <= iv.lo : x < iv.lo;
  bool above = iv.hi_open ? x >= iv.hi : x > iv.hi;
  if (below || above) {
    interval_text(iv, range, sizeof range);
    ff_diag_error(d, path, "%s is out of range (expected a number %s%s)", num,
                  iv.hi >= 1e300 ? "" : "in ", range);
    return false;
  }
  *out = x;
  return true;
}

bool ff_name_valid(const char *s) {
  size_t n = strlen(s);
  if (n < 1 || n > 64)
    return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
          c == '.' || c == '_' || c == '-'))
      return false;
  }
  return true;
}

bool ff_json_as_name(ff_diag *d, const cJSON *v, const char *path, char *out) {
  if (!cJSON_IsString(v)) {
    report_type(d, v, path, "a name (a string)");
    return false;
  }
  if (!ff_name_valid(v->valuestring)) {
    char got[80];
    preview(v, got, sizeof got);
    ff_diag_error(d, path, "%s is not a valid name (expected 1 to 64 characters from A-Z a-z "
                  "0-9 . _ -)", got);
    return false;
  }
  snprintf(out, 65, "%s", v->valuestring);
  return true;
}

bool ff_json_as_span(ff_diag *d, const cJSON *v, const char *path, int64_t lo, int64_t hi,
                     int64_t out[2]) {
  if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2) {
    if (cJSON_IsArray(v))
      ff_diag_error(d, path, "expected a range [first, end], got an array of %d elements",
                    cJSON_GetArraySize(v));
    else
      report_type(d, v, path, "a range [first, end]");
    return false;
  }
  char p[FF_PATH_MAX];
  int64_t a, b;
  index_path(path, 0, p, sizeof p);
  if (!ff_json_as_int(d, cJSON_GetArrayItem(v, 0), p, lo, hi, &a))
    return false;
  index_path(path, 1, p, sizeof p);
  if (!ff_json_as_int(d, cJSON_GetArrayItem(v, 1), p, lo, hi, &b))
    return false;
  if (b < a) {
    ff_diag_error(d, path, "range [%lld, %lld] ends before it starts (expected first <= end)",
                  (long long)a, (long long)b);
    return false;
  }
  out[0] = a;
  out[1] = b;
  return true;
}

/* ---- objects ---------------------------------------------------------------------------- */

bool ff_jobj_open(ff_jobj *o, ff_diag *d, const cJSON *v, const char *path) {
  memset(o, 0, sizeof *o);
  o->json = v;
  o->diag = d;
  snprintf(o->path, sizeof o->path, "%s", path ? path : "");
  o->is_object = cJSON_IsObject(v);
  if (!o->is_object)
    report_type(d, v, *o->path ? o->path : "(top level)", "an object");
  return o->is_object;
}

void ff_jobj_path(const ff_jobj *o, const char *key, char *out, size_t cap) {
  child_path(o->path, key, out, cap);
}

const cJSON *ff_jobj_get(ff_jobj *o, const char *key, bool required) {
  bool seen = false;
  for (int i = 0; i < o->n_known && !seen; i++)
    seen = strcmp(o->known[i], key) == 0;
  if (!seen && o->n_known < FF_JOBJ_MAX_KEYS)
    o->known[o->n_known++] = key;
  if (!o->is_object)
    return NULL;
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o->json, key);
  if (!v && required)
    ff_diag_error(o->diag, *o->path ? o->path : "(top level)", "missing required key \"%s\"",
                  key);
  return v;
}

bool ff_jobj_int(ff_jobj *o, const char *key, bool required, int64_t lo, int64_t hi,
                 int64_t *out) {
  const cJSON *v = ff_jobj_get(o, key, required);
  if (!v)
    return false;
  char p[FF_PATH_MAX];
  ff_jobj_path(o, key, p, sizeof p);
  return ff_json_as_int(o->diag, v, p, lo, hi, out);
}

bool ff_jobj_num(ff_jobj *o, const char *key, bool required, ff_interval iv, double *out) {
  const cJSON *v = ff_jobj_get(o, key, required);
  if (!v)
    return false;
  char p[FF_PATH_MAX];
  ff_jobj_path(o, key, p, sizeof p);
  return ff_json_as_num(o->diag, v, p, iv, out);
}

bool ff_jobj_bool(ff_jobj *o, const char *key, bool required, bool *out) {
  const cJSON *v = ff_jobj_get(o, key, required);
  if (!v)
    return false;
  if (!cJSON_IsBool(v)) {
    char p[FF_PATH_MAX];
    ff_jobj_path(o, key, p, sizeof p);
    report_type(o->diag, v, p, "true or false");
    return false;
  }
  *out = cJSON_IsTrue(v);
  return true;
}

bool ff_jobj_name(ff_jobj *o, const char *key, bool required, char *out) {
  const cJSON *v = ff_jobj_get(o, key, required);
  if (!v)
    return false;
  char p[FF_PATH_MAX];
  ff_jobj_path(o, key, p, sizeof p);
  return ff_json_as_name(o->diag, v, p, out);
}

bool ff_jobj_text(ff_jobj *o, const char *key, bool required, size_t max_len, char **out) {
  const cJSON *v = ff_jobj_get(o, key, required);
  if (!v)
    return false;
  char p[FF_PATH_MAX];
  ff_jobj_path(o, key, p, sizeof p);
  if (!cJSON_IsString(v)) {
    report_type(o->diag, v, p, "a string");
    return false;
  }
  size_t n = strlen(v->valuestring);
  if (n > max_len) {
    ff_diag_error(o->diag, p, "string of %zu bytes is too long (at most %zu)", n, max_len);
    return false;
  }
  char *s = strdup(v->valuestring);
  if (!s) {
    ff_diag_error(o->diag, p, "out of memory");
    return false;
  }
  free(*out);
  *out = s;
  return true;
}

void ff_join_choices(const char *const *choices, char *out, size_t cap) {
  size_t j = 0;
  out[0] = '\0';
  for (int i = 0; choices[i] && j < cap; i++)
    j += (size_t)snprintf(out + j, cap - j, "%s%s", i ? ", " : "", choices[i]);
}

bool ff_jobj_enum(ff_jobj *o, const char *key, bool required, const char *const *choices,
                  int *out) {
  const cJSON *v = ff_jobj_get(o, key, required);
  if (!v)
    return false;
  char p[FF_PATH_MAX], list[256];
  ff_jobj_path(o, key, p, sizeof p);
  ff_join_choices(choices, list, sizeof list);
  if (!cJSON_IsString(v)) {
    char expected[300];
    snprintf(expected, sizeof expected, "one of %s", list);
    report_type(o->diag, v, p, expected);
    return false;
  }
  for (int i = 0; choices[i]; i++) {
    if (strcmp(v->valuestring, choices[i]) == 0) {
      *out = i;
      return true;
    }
  }
  char got[80];
  preview(v, got, sizeof got);
  ff_diag_error(o->diag, p, "%s is not one of: %s", got, list);
  return false;
}

bool ff_jobj_span(ff_jobj *o, const char *key, bool required, int64_t lo, int64_t hi,
                  int64_t out[2]) {
  const cJSON *v = ff_jobj_get(o, key, required);
  if (!v)
    return false;
  char p[FF_PATH_MAX];
  ff_jobj_path(o, key, p, sizeof p);
  return ff_json_as_span(o->diag, v, p, lo, hi, out);
}

const cJSON *ff_jobj_array(ff_jobj *o, const char *key, bool required, int min, int max) {
  const cJSON *v = ff_jobj_get(o, key, required);
  if (!v)
    return NULL;
  char p[FF_PATH_MAX];
  ff_jobj_path(o, key, p, sizeof p);
  if (!cJSON_IsArray(v)) {
    report_type(o->diag, v, p, "an array");
    return NULL;
  }
  int n = cJSON_GetArraySize(v);
  if (n < min || n > max) {
    if (n < min && min == 1)
      ff_diag_error(o->diag, p, "expected at least one element, got an empty array");
    else
      ff_diag_error(o->diag, p, "expected %d to %d elements, got %d", min, max, n);
    return NULL;
  }
  return v;
}

static size_t edit_distance(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  if (n > 63 || m > 63)
    return 64;
  size_t row[64];
  for (size_t j = 0; j <= m; j++)
    row[j] = j;
  for (size_t i = 1; i <= n; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= m; j++) {
      size_t up = row[j];
      size_t best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best)
        best = up + 1;
      if (row[j - 1] + 1 < best)
        best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[m];
}

void ff_jobj_close(ff_jobj *o) {
  if (!o->is_object)
    return;
  for (const cJSON *c = o->json->child; c; c = c->next) {
    bool known = false;
    for (int i = 0; i < o->n_known && !known; i++)
      known = strcmp(c->string, o->known[i]) == 0;
    if (known)
      continue;
    const char *hint = NULL;
    size_t best = 3;
    for (int i = 0; i < o->n_known; i++) {
      size_t dist = edit_distance(c->string, o->known[i]);
      size_t limit = strlen(o->known[i]) / 3 + 1;
      if (dist < best && dist <= limit) {
        best = dist;
        hint = o->known[i];
      }
    }
    char p[FF_PATH_MAX], list[512];
    size_t j = 0;
    list[0] = '\0';
    for (int i = 0; i < o->n_known && j < sizeof list; i++)
      j += (size_t)snprintf(list + j, sizeof list - j, "%s%s", i ? ", " : "", o->known[i]);
    char key[80];
    if (strlen(c->string) > 64)
      snprintf(key, sizeof key, "%.61s...", c->string);
    else
      snprintf(key, sizeof key, "%s", c->string);
    ff_jobj_path(o, key, p, sizeof p);
    if (hint)
      ff_diag_error(o->diag, p, "unknown key \"%s\" (did you mean \"%s\"?)", key, hint);
    else
      ff_diag_error(o->diag, p, "unknown key \"%s\" (expected one of: %s)", key, list);
  }
}

/* ---- writing ---------------------------------------------------------------------------- */

void ff_buf_free(ff_buf *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

void ff_buf_put(ff_buf *b, const char *s, size_t n) {
  if (b->failed)
    return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (b->len + n + 1 > cap)
      cap *= 2;
    char *data = realloc(b->data, cap);
    if (!data) {
      b->failed = true;
      return;
    }
    b->data = data;
    b->cap = cap;
  }
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void ff_buf_puts(ff_buf *b, const char *s) { ff_buf_put(b, s, strlen(s)); }

void ff_buf_printf(ff_buf *b, const char *fmt, ...) {
  char small[512];
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof small) {
    ff_buf_put(b, small, (size_t)n);
  } else if (n >= 0) {
    char *big = malloc((size_t)n + 1);
    if (big) {
      vsnprintf(big, (size_t)n + 1, fmt, ap2);
      ff_buf_put(b, big, (size_t)n);
      free(big);
    } else {
      b->failed = true;
    }
  }
  va_end(ap2);
}

void ff_format_double(double x, char out[32]) {
  if (!isfinite(x)) {
    snprintf(out, 32, "%s", isnan(x) ? "NaN" : (x > 0 ? "Infinity" : "-Infinity"));
    return;
  }
  if (x == floor(x) && fabs(x) < 9007199254740992.0) {
    snprintf(out, 32, "%.0f", x);
    return;
  }
  for (int precision = 1; precision <= 17; precision++) {
    snprintf(out, 32, "%.*g", precision, x);
    if (strtod(out, NULL) == x)
      return;
  }
}

static void write_string(ff_buf *b, const char *s) {
  ff_buf_put(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
    case '"': ff_buf_put(b, "\\\"", 2); break;
    case '\\': ff_buf_put(b, "\\\\", 2); break;
    case '\n': ff_buf_put(b, "\\n", 2); break;
    case '\t': ff_buf_put(b, "\\t", 2); break;
    case '\r': ff_buf_put(b, "\\r", 2); break;
    case '\b': ff_buf_put(b, "\\b", 2); break;
    case '\f': ff_buf_put(b, "\\f", 2); break;
    default:
      if (*p < 0x20)
        ff_buf_printf(b, "\\u%04x", *p);
      else
        ff_buf_put(b, (const char *)p, 1);
    }
  }
  ff_buf_put(b, "\"", 1);
}

static bool is_container(const cJSON *v) { return cJSON_IsArray(v) || cJSON_IsObject(v); }

static bool scalar_array(const cJSON *v) {
  if (!cJSON_IsArray(v))
    return false;
  for (const cJSON *c = v->child; c; c = c->next)
    if (is_container(c))
      return false;
  return true;
}

/* An array element written on one line: members all scalars or scalar arrays. */
static bool flat_object(const cJSON *v) {
  if (!cJSON_IsObject(v))
    return false;
  for (const cJSON *c = v->child; c; c = c->next)
    if (cJSON_IsObject(c) || (cJSON_IsArray(c) && !scalar_array(c)))
      return false;
  return true;
}

static void write_value(ff_buf *b, const cJSON *v, int indent, bool inline_all);

static void write_indent(ff_buf *b, int indent) {
  for (int i = 0; i < indent; i++)
    ff_buf_put(b, "  ", 2);
}

static void write_value(ff_buf *b, const cJSON *v, int indent, bool inline_all) {
  char num[32];
  if (cJSON_IsNumber(v)) {
    ff_format_double(v->valuedouble, num);
    ff_buf_puts(b, num);
  } else if (cJSON_IsString(v)) {
    write_string(b, v->valuestring);
  } else if (cJSON_IsBool(v)) {
    ff_buf_puts(b, cJSON_IsTrue(v) ? "true" : "false");
  } else if (cJSON_IsNull(v)) {
    ff_buf_puts(b, "null");
  } else if (cJSON_IsArray(v)) {
    if (!v->child) {
      ff_buf_puts(b, "[]");
    } else if (inline_all || scalar_array(v)) {
      ff_buf_puts(b, "[");
      for (const cJSON *c = v->child; c; c = c->next) {
        write_value(b, c, indent, true);
        if (c->next)
          ff_buf_puts(b, ", ");
      }
      ff_buf_puts(b, "]");
    } else {
      ff_buf_puts(b, "[\n");
      for (const cJSON *c = v->child; c; c = c->next) {
        write_indent(b, indent + 1);
        write_value(b, c, indent + 1, flat_object(c));
        ff_buf_puts(b, c->next ? ",\n" : "\n");
      }
      write_indent(b, indent);
      ff_buf_puts(b, "]");
    }
  } else if (cJSON_IsObject(v)) {
    if (!v->child) {
      ff_buf_puts(b, "{}");
    } else if (inline_all) {
      ff_buf_puts(b, "{");
      for (const cJSON *c = v->child; c; c = c->next) {
        write_string(b, c->string);
        ff_buf_puts(b, ": ");
        write_value(b, c, indent, true);
        if (c->next)
          ff_buf_puts(b, ", ");
      }
      ff_buf_puts(b, "}");
    } else {
      ff_buf_puts(b, "{\n");
      for (const cJSON *c = v->child; c; c = c->next) {
        write_indent(b, indent + 1);
        write_string(b, c->string);
        ff_buf_puts(b, ": ");
        write_value(b, c, indent + 1, false);
        ff_buf_puts(b, c->next ? ",\n" : "\n");
      }
      write_indent(b, indent);
      ff_buf_puts(b, "}");
    }
  }
}

void ff_json_write(const cJSON *root, ff_buf *b) {
  write_value(b, root, 0, false);
  ff_buf_puts(b, "\n");
}

/* Every byte of one piece, through short writes and interrupted calls; 0 or errno. */
static int write_all(int fd, const char *data, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t w = write(fd, data + done, len - done);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return errno;
    }
    done += (size_t)w;
  }
  return 0;
}

struct ff_atomic_file {
  char *file, *tmp;
  int fd;
  int err; /* the first errno; 0 while all is well */
};

ff_atomic_file *ff_atomic_open(const char *file, ff_diag *d) {
  size_t n = strlen(file);
  ff_atomic_file *f = calloc(1, sizeof *f);
  char *name = malloc(n + 1), *tmp = malloc(n + 16);
  if (!f || !name || !tmp) {
    free(f), free(name), free(tmp);
    ff_diag_error(d, NULL, "out of memory");
    return NULL;
  }
  memcpy(name, file, n + 1);
  memcpy(tmp, file, n);
  memcpy(tmp + n, ".tmp.XXXXXX", 12);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    ff_diag_error(d, NULL, "cannot create a temporary file beside %s: %s", file, strerror(errno));
    free(f), free(name), free(tmp);
    return NULL;
  }
  *f = (ff_atomic_file){name, tmp, fd, 0};
  return f;
}

void ff_atomic_write(ff_atomic_file *f, const void *data, size_t len) {
  if (!f->err)
    f->err = write_all(f->fd, data, len);
}

void ff_atomic_write_at(ff_atomic_file *f, const void *data, size_t len, int64_t offset) {
  const char *p = data;
  while (!f->err && len > 0) {
    ssize_t w = pwrite(f->fd, p, len, (off_t)offset);
    if (w < 0 && errno != EINTR)
      f->err = errno;
    else if (w == 0)
      f->err = EIO; /* no progress: not a regular file's answer */
    else if (w > 0)
      p += w, len -= (size_t)w, offset += w;
  }
}

static void atomic_free(ff_atomic_file *f) {
  free(f->file);
  free(f->tmp);
  free(f);
}

void ff_atomic_discard(ff_atomic_file *f) {
  if (!f)
    return;
  close(f->fd);
  unlink(f->tmp);
  atomic_free(f);
}

ff_status ff_atomic_commit(ff_atomic_file *f, ff_diag *d) {
  int err = f->err;
  if (!err && fsync(f->fd) != 0)
    err = errno;
  if (close(f->fd) != 0 && !err)
    err = errno;
  if (!err) {
    chmod(f->tmp, 0644); /* mkstemp creates 0600; outputs are ordinary readable files */
    if (rename(f->tmp, f->file) != 0)
      err = errno;
  }
  if (err) {
    unlink(f->tmp);
    ff_diag_error(d, NULL, "cannot write %s: %s (nothing was changed)", f->file, strerror(err));
  }
  atomic_free(f);
  return err ? FF_ERR_RUNTIME : FF_OK;
}

ff_status ff_write_file_atomic(const char *file, const char *data, size_t len, ff_diag *d) {
  if (strcmp(file, "-") == 0) {
    if (fwrite(data, 1, len, stdout) != len || fflush(stdout) != 0) {
      ff_diag_error(d, NULL, "cannot write to standard output: %s", strerror(errno));
      return FF_ERR_RUNTIME;
    }
    return FF_OK;
  }
  ff_atomic_file *f = ff_atomic_open(file, d);
  if (!f)
    return FF_ERR_RUNTIME;
  ff_atomic_write(f, data, len);
  return ff_atomic_commit(f, d);
}

uint64_t ff_fnv1a64_update(uint64_t h, const void *data, size_t len) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t ff_fnv1a64(const void *data, size_t len) {
  return ff_fnv1a64_update(FF_FNV1A64_INIT, data, len);
}

ff_status ff_write_json_atomic(const char *file, const cJSON *root, ff_diag *d) {
  ff_buf text = {0};
  ff_json_write(root, &text);
  ff_status st = FF_ERR_RUNTIME;
  if (text.failed)
    ff_diag_error(d, NULL, "out of memory rendering the document");
  else
    st = ff_write_file_atomic(file, text.data, text.len, d);
  ff_buf_free(&text);
  return st;
}
