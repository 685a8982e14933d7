/* ff_format_internal.h — helpers shared by the format readers in common/; not a public API. */
#ifndef FF_FORMAT_INTERNAL_H
#define FF_FORMAT_INTERNAL_H

#include "ff_format.h"

/* Mark "format" known and check it: required and equal to the format's id at the top level;
 * optional (but still checked) when the object is nested inline. */
bool ff_format_key(ff_jobj *o, ff_format_kind kind, bool inline_ok);
ff_status ff_device_copy(const ff_device *src, ff_device *dst);

#endif
