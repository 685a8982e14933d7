/* test_train.c — the executor's step helpers (executor/train.c) on their own: the emulated
 * slower device of --throttle. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "train.h"

static double monotonic(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* An emulated device F times slower takes F × the processor time of the work, whatever the wall
 * time was: it waits out the difference when the work took less, and adds nothing when the
 * process was kept from running longer than that (time preempted is not the device's). */
static void throttle_charges_factor_times_processor_time(void **state) {
  (void)state;
  assert_float_equal(ff_throttle(1.0, 0.5, 0.1), 0.5, 0);   /* no emulation: the wall time */
  assert_float_equal(ff_throttle(0.5, 0.5, 0.1), 0.5, 0);
  assert_float_equal(ff_throttle(4.0, 0.010, 0.002), 0.010, 0); /* preempted beyond 4× */
  double t0 = monotonic();
  assert_float_equal(ff_throttle(4.0, 0.001, 0.001), 0.004, 1e-15);
  assert_true(monotonic() - t0 >= 0.003 - 1e-6); /* it waited the 3 ms the work did not take */
  t0 = monotonic();
  assert_float_equal(ff_throttle(12.0, 0.0, 0.0005), 0.006, 1e-15);
  assert_true(monotonic() - t0 >= 0.006 - 1e-6);
}

/* The processor clock counts this process's work, not time asleep. */
static void cpu_seconds_count_work_not_sleep(void **state) {
  (void)state;
  double c0 = ff_cpu_seconds();
  struct timespec nap = {0, 20 * 1000 * 1000};
  nanosleep(&nap, NULL);
  double slept = ff_cpu_seconds() - c0;
  volatile double x = 0;
  double c1 = ff_cpu_seconds();
  while (ff_cpu_seconds() - c1 < 0.01)
    x += 1;
  assert_true(slept >= 0 && slept < 0.02);
  assert_true(ff_cpu_seconds() - c1 >= 0.01);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(throttle_charges_factor_times_processor_time),
      cmocka_unit_test(cpu_seconds_count_work_not_sleep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
