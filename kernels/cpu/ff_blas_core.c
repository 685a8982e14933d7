/* ff_blas_core.c — OpenBLAS's kernels chosen from the CPU's vector extensions (ff_blas_core.h). */
#define _GNU_SOURCE /* setenv */
#include "ff_blas_core.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* OpenBLAS's own; the netlib cblas.h does not declare it. */
char *openblas_get_corename(void);

/* The environment variable that carries OpenBLAS's own choice across the re-execution. */
#define FF_BLAS_CORE_WAS "FF_BLAS_CORE_WAS"

ff_isa_tier ff_cpu_isa_tier(void) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d))
    return FF_ISA_BASE;
  bool osxsave = c & (1u << 27), avx = c & (1u << 28), fma = c & (1u << 12);
  if (!osxsave || !avx)
    return FF_ISA_BASE;
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0)); /* XCR0: what the OS saves */
  (void)hi;
  if ((lo & 0x6u) != 0x6u) /* XMM and YMM state */
    return FF_ISA_BASE;
  unsigned max = __get_cpuid_max(0, NULL);
  if (max < 7)
    return FF_ISA_AVX;
  __cpuid_count(7, 0, a, b, c, d);
  bool avx2 = b & (1u << 5);
  if (!avx2 || !fma)
    return FF_ISA_AVX;
  const unsigned avx512 = (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31);
  if ((b & avx512) == avx512 && (lo & 0xE0u) == 0xE0u) /* F DQ CD BW VL; opmask and ZMM state */
    return FF_ISA_AVX512;
  return FF_ISA_AVX2;
#else
  return FF_ISA_BASE;
#endif
}

/* OpenBLAS 0.3's x86 cores (driver/others/dynamic.c) by the instructions their kernels use. */
static const struct {
  const char *name;
  ff_isa_tier tier;
} cores[] = {
    {"Katmai", FF_ISA_BASE},       {"Coppermine", FF_ISA_BASE},  {"Northwood", FF_ISA_BASE},
    {"Prescott", FF_ISA_BASE},     {"Banias", FF_ISA_BASE},      {"Atom", FF_ISA_BASE},
    {"Core2", FF_ISA_BASE},        {"Penryn", FF_ISA_BASE},      {"Dunnington", FF_ISA_BASE},
    {"Nehalem", FF_ISA_BASE},      {"Athlon", FF_ISA_BASE},      {"Opteron", FF_ISA_BASE},
    {"Opteron_SSE3", FF_ISA_BASE}, {"Barcelona", FF_ISA_BASE},   {"Nano", FF_ISA_BASE},
    {"Bobcat", FF_ISA_BASE},       {"Sandybridge", FF_ISA_AVX},  {"Bulldozer", FF_ISA_AVX},
    {"Piledriver", FF_ISA_AVX},    {"Steamroller", FF_ISA_AVX},  {"Excavator", FF_ISA_AVX2},
    {"Haswell", FF_ISA_AVX2},      {"Zen", FF_ISA_AVX2},         {"SkylakeX", FF_ISA_AVX512},
    {"Cooperlake", FF_ISA_AVX512}, {"SapphireRapids", FF_ISA_AVX512},
};

int ff_blas_core_tier(const char *core) {
  if (!core)
    return -1;
  for (size_t i = 0; i < sizeof cores / sizeof *cores; i++)
    if (strcasecmp(core, cores[i].name) == 0)
      return (int)cores[i].tier;
  return -1;
}

const char *ff_blas_core_better(const char *current, ff_isa_tier cpu) {
  static const char *const generic[] = {NULL, "Sandybridge", "Haswell", "SkylakeX"};
  int have = ff_blas_core_tier(current);
  if (have < 0 || have >= (int)cpu)
    return NULL;
  return generic[cpu];
}

void ff_blas_core_restart(char **argv, const char *current, ff_isa_tier cpu) {
  const char *want = ff_blas_core_better(current, cpu);
  if (!want)
    return;
#ifdef __linux__
  if (setenv("OPENBLAS_CORETYPE", want, 1) != 0 || setenv(FF_BLAS_CORE_WAS, current, 1) != 0)
    return;
  fflush(NULL);
  execv("/proc/self/exe", argv);
  fprintf(stderr, "warning: could not restart with OPENBLAS_CORETYPE=%s (%s); OpenBLAS keeps its "
          "%s kernels\n", want, strerror(errno), current);
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(FF_BLAS_CORE_WAS);
#else
  (void)argv;
#endif
}

void ff_blas_core_select(char **argv) {
  if (getenv("OPENBLAS_CORETYPE")) /* the user's choice, or ours after the re-execution */
    return;
  const char *keep = getenv("FF_BLAS_CORE");
  if (keep && strcmp(keep, "keep") == 0)
    return;
  ff_blas_core_restart(argv, openblas_get_corename(), ff_cpu_isa_tier());
}

void ff_blas_core_describe(char *out, size_t cap) {
  const char *now = openblas_get_corename();
  const char *was = getenv(FF_BLAS_CORE_WAS);
  if (was && *was)
    snprintf(out, cap, "%s (chosen from CPUID; OpenBLAS picked %s)", now ? now : "?", was);
  else
    snprintf(out, cap, "%s", now ? now : "?");
}
