/* ff_diag.c — collecting user-facing error messages; see ff_diag.h. */
#include "ff_diag.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void ff_diag_init(ff_diag *d, const char *file) {
  memset(d, 0, sizeof *d);
  d->file = file;
  d->max_errors = FF_DIAG_MAX_ERRORS_DEFAULT;
}

void ff_diag_free(ff_diag *d) {
  free(d->text);
  d->text = NULL;
  d->len = d->cap = 0;
}

static void diag_append(ff_diag *d, const char *s, size_t n) {
  if (d->len + n + 1 > d->cap) {
    size_t cap = d->cap ? d->cap : 256;
    while (d->len + n + 1 > cap)
      cap *= 2;
    char *text = realloc(d->text, cap);
    if (!text)
      return; /* keep what we have: losing a message beats crashing while reporting one */
    d->text = text;
    d->cap = cap;
  }
  memcpy(d->text + d->len, s, n);
  d->len += n;
  d->text[d->len] = '\0';
}

static void diag_vappend(ff_diag *d, const char *fmt, va_list ap) {
  char small[1024];
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  if (n < 0) {
    va_end(ap2);
    return;
  }
  if ((size_t)n < sizeof small) {
    diag_append(d, small, (size_t)n);
  } else {
    char *big = malloc((size_t)n + 1);
    if (big) {
      vsnprintf(big, (size_t)n + 1, fmt, ap2);
      diag_append(d, big, (size_t)n);
      free(big);
    }
  }
  va_end(ap2);
}

void ff_diag_error(ff_diag *d, const char *path, const char *fmt, ...) {
  d->errors++;
  if (d->errors > d->max_errors)
    return;
  char prefix[1200];
  int n;
  if (path && *path)
    n = snprintf(prefix, sizeof prefix, "%s: %s: ", d->file ? d->file : "<input>", path);
  else
    n = snprintf(prefix, sizeof prefix, "%s: ", d->file ? d->file : "<input>");
  diag_append(d, prefix, (size_t)n < sizeof prefix ? (size_t)n : sizeof prefix - 1);
  va_list ap;
  va_start(ap, fmt);
  diag_vappend(d, fmt, ap);
  va_end(ap);
  diag_append(d, "\n", 1);
}

void ff_diag_line(ff_diag *d, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vappend(d, fmt, ap);
  va_end(ap);
  diag_append(d, "\n", 1);
}

bool ff_diag_ok(const ff_diag *d) { return d->errors == 0; }

const char *ff_diag_text(const ff_diag *d) { return d->text ? d->text : ""; }

void ff_diag_print(const ff_diag *d, FILE *stream) {
  fputs(ff_diag_text(d), stream);
  if (d->errors > d->max_errors)
    fprintf(stream, "%s: %d more error%s not shown\n", d->file ? d->file : "<input>",
            d->errors - d->max_errors, d->errors - d->max_errors == 1 ? "" : "s");
}
