/* ff_format_internal.h — helpers shared by the format readers in common/; not a public API. */
#ifndef FF_FORMAT_INTERNAL_H
#define FF_FORMAT_INTERNAL_H

#include "ff_format.h"

/* Mark "format" known and check it: required and equal to the format's id at the top level;
 * optional (but still checked) when the object is nested inline. */
bool ff_format_key(ff_jobj *o, ff_format_kind kind, bool inline_ok);
/* Check that a file named by a reference (a cluster's device file, a plan's input) can be read;
 * if not, report it at the referencing JSON path. */
ff_status ff_load_referenced(const char *file, const char *path, const char *what, ff_diag *d);
ff_status ff_device_copy(const ff_device *src, ff_device *dst);

#endif
