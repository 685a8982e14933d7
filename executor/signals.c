/* signals.c — see signals.h. */
#define _POSIX_C_SOURCE 200809L
#include "signals.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t requested;

static void on_stop(int sig) {
  if (requested) /* the second signal: stop at once */
    _exit(128 + sig);
  requested = sig;
}

void ff_signals_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGXFSZ, SIG_IGN);
}

int ff_signals_pending(void) { return requested; }

const char *ff_signal_name(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal";
}
