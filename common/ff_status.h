/* ff_status.h — result codes and the check macros every library function uses.
 *
 * Library code never calls exit(): it returns an ff_status, and callers propagate it with
 * FF_CHECK (return at once) or FF_CHECK_GOTO (jump to the function's one cleanup label, which
 * frees in reverse order of allocation). Only main() turns a status into an exit code; the values
 * are chosen so that main() can return them directly. */
#ifndef FF_STATUS_H
#define FF_STATUS_H

typedef enum ff_status {
  FF_OK = 0,
  FF_ERR_RUNTIME = 1,    /* I/O failure, out of memory, a peer lost */
  FF_ERR_INPUT = 2,      /* bad input or usage: the message says what to fix */
  FF_ERR_INFEASIBLE = 3, /* inputs are valid but nothing fits */
} ff_status;

const char *ff_status_name(ff_status st);

#define FF_CHECK(expr)                      \
  do {                                      \
    ff_status ff_check_st_ = (expr);        \
    if (ff_check_st_ != FF_OK)              \
      return ff_check_st_;                  \
  } while (0)

#define FF_CHECK_GOTO(expr, st, label)      \
  do {                                      \
    (st) = (expr);                          \
    if ((st) != FF_OK)                      \
      goto label;                           \
  } while (0)

#endif
