/* signals.h — stopping cleanly: SIGINT or SIGTERM asks the run to stop at the next step boundary
 * (with a final checkpoint); a second one stops at once. SIGXFSZ is ignored, so a write past a
 * file-size limit fails with an error instead of killing the process. The request is the one
 * piece of process-wide state (a signal handler can reach nothing else). */
#ifndef FF_EXEC_SIGNALS_H
#define FF_EXEC_SIGNALS_H

void ff_signals_install(void);
/* The signal that asked to stop, or 0. */
int ff_signals_pending(void);
const char *ff_signal_name(int sig);

#endif
