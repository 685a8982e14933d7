/* test_blas_core.c — OpenBLAS's kernels chosen from CPUID (kernels/ff_blas_core.h): the choice
 * table, and the restart itself: a child made to believe OpenBLAS picked Prescott re-executes
 * this program, whose OpenBLAS must then run the core asked for. */
#define _GNU_SOURCE /* setenv */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ff_blas_core.h"

char *openblas_get_corename(void);

static char **main_argv;

static void the_better_core_is_of_the_cpus_tier_and_only_upward(void **state) {
  (void)state;
  assert_string_equal(ff_blas_core_better("Prescott", FF_ISA_AVX512), "SkylakeX");
  assert_string_equal(ff_blas_core_better("Prescott", FF_ISA_AVX2), "Haswell");
  assert_string_equal(ff_blas_core_better("nehalem", FF_ISA_AVX), "Sandybridge");
  assert_string_equal(ff_blas_core_better("Sandybridge", FF_ISA_AVX2), "Haswell");
  assert_string_equal(ff_blas_core_better("Zen", FF_ISA_AVX512), "SkylakeX");
  assert_null(ff_blas_core_better("Prescott", FF_ISA_BASE)); /* nothing better to run */
  assert_null(ff_blas_core_better("Haswell", FF_ISA_AVX2));
  assert_null(ff_blas_core_better("Cooperlake", FF_ISA_AVX512));
  assert_null(ff_blas_core_better("SkylakeX", FF_ISA_AVX2)); /* never downward */
  assert_null(ff_blas_core_better("Unknown", FF_ISA_AVX512)); /* not a core of the table */
  assert_null(ff_blas_core_better("ARMV8", FF_ISA_AVX512));
  assert_null(ff_blas_core_better(NULL, FF_ISA_AVX512));
  assert_int_equal(ff_blas_core_tier("SapphireRapids"), FF_ISA_AVX512);
  assert_int_equal(ff_blas_core_tier("Excavator"), FF_ISA_AVX2);
  assert_int_equal(ff_blas_core_tier("Piledriver"), FF_ISA_AVX);
  assert_int_equal(ff_blas_core_tier("Core2"), FF_ISA_BASE);
  assert_int_equal(ff_blas_core_tier(""), -1);
}

/* This process ran ff_blas_core_select() in main(): what OpenBLAS runs is of the CPU's tier (or
 * a core the table does not know, which is left alone). */
static void this_process_runs_kernels_of_its_cpus_tier(void **state) {
  (void)state;
  const char *core = openblas_get_corename();
  int tier = ff_blas_core_tier(core);
  printf("OpenBLAS core %s (tier %d), CPU tier %d\n", core, tier, (int)ff_cpu_isa_tier());
  assert_true(tier < 0 || tier >= (int)ff_cpu_isa_tier() || getenv("OPENBLAS_CORETYPE"));
}

static void a_restart_gets_the_core_it_asks_for(void **state) {
  (void)state;
  ff_isa_tier cpu = ff_cpu_isa_tier();
  const char *want = ff_blas_core_better("Prescott", cpu);
  if (!want) {
    printf("a CPU without AVX: nothing better than Prescott to ask for\n");
    return;
  }
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    setenv("FF_TEST_BLAS_CHILD", "1", 1);
    unsetenv("OPENBLAS_CORETYPE");
    ff_blas_core_restart(main_argv, "Prescott", cpu);
    _exit(3); /* the restart returned */
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* The restarted child: OpenBLAS must run what OPENBLAS_CORETYPE asked for, and say where it
 * came from. */
static int child(void) {
  const char *asked = getenv("OPENBLAS_CORETYPE"), *now = openblas_get_corename();
  char text[256];
  ff_blas_core_describe(text, sizeof text);
  printf("restarted: asked %s, OpenBLAS runs %s: %s\n", asked ? asked : "-", now, text);
  if (!asked || strcasecmp(asked, now) != 0)
    return 1;
  return strstr(text, "OpenBLAS picked Prescott") ? 0 : 2;
}

int main(int argc, char **argv) {
  (void)argc;
  if (getenv("FF_TEST_BLAS_CHILD"))
    return child();
  ff_blas_core_select(argv);
  main_argv = argv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(the_better_core_is_of_the_cpus_tier_and_only_upward),
      cmocka_unit_test(this_process_runs_kernels_of_its_cpus_tier),
      cmocka_unit_test(a_restart_gets_the_core_it_asks_for),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
