/* ff_diag.h — the one error path for user-facing problems.
 *
 * A diagnostics context collects messages of the form `FILE: JSON_PATH: what was expected` while a
 * file is read and checked, so that one run reports every problem (up to a limit) rather than the
 * first. Messages are kept in memory; the program prints them once (ff_diag_print), and tests
 * compare them. Nothing here exits or prints on its own. */
#ifndef FF_DIAG_H
#define FF_DIAG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define FF_DIAG_MAX_ERRORS_DEFAULT 20

typedef struct ff_diag {
  const char *file; /* the file being read, as the user named it; may change while reading */
  int errors;       /* errors reported, including those past the limit */
  int max_errors;   /* messages kept; later ones are only counted */
  char *text;       /* the kept messages, one per line */
  size_t len, cap;
} ff_diag;

void ff_diag_init(ff_diag *d, const char *file);
void ff_diag_free(ff_diag *d);
/* Report an error at a JSON path (NULL or "" for the file as a whole). */
void ff_diag_error(ff_diag *d, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Append a line verbatim (e.g. a usage message). */
void ff_diag_line(ff_diag *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool ff_diag_ok(const ff_diag *d);
const char *ff_diag_text(const ff_diag *d); /* never NULL */
/* Print the kept messages, then a count of those left out. */
void ff_diag_print(const ff_diag *d, FILE *stream);

#endif
