/* ff_blas_core.h — OpenBLAS's kernels chosen from the CPU's vector extensions.
 *
 * OpenBLAS (built with DYNAMIC_ARCH, as Debian's is) picks its kernels once, when the library
 * loads, from the CPU model; a model newer than its table gets the SSE3 "Prescott" kernels,
 * 2.5-5x slower on a CPU with AVX-512. Its only other input is the OPENBLAS_CORETYPE variable,
 * read at that same moment, so a program that wants better kernels must set it and start again.
 * ff_blas_core_select() does that, before anything else runs: where OpenBLAS chose a core whose
 * instructions are a lower tier than the CPU's (AVX-512 > AVX2 + FMA > AVX > none), it sets
 * OPENBLAS_CORETYPE to the generic core of the CPU's tier (SkylakeX, Haswell, Sandybridge) and
 * executes the program again with the same arguments. It never names a core whose instructions
 * the CPU or the operating system lacks, and never overrides a choice of the user's
 * (OPENBLAS_CORETYPE set) or a core it does not know. FF_BLAS_CORE=keep turns it off. */
#ifndef FF_BLAS_CORE_H
#define FF_BLAS_CORE_H

#include <stdbool.h>
#include <stddef.h>

/* The instruction tiers a core's kernels use, and that a CPU (with its OS) supports. */
typedef enum ff_isa_tier {
  FF_ISA_BASE = 0, /* SSE2/SSE3 only */
  FF_ISA_AVX,      /* AVX, with the OS saving YMM state */
  FF_ISA_AVX2,     /* AVX2 and FMA */
  FF_ISA_AVX512,   /* AVX-512 F, CD, BW, DQ and VL, with the OS saving ZMM state */
} ff_isa_tier;

/* The tier of the running CPU, from CPUID and XGETBV (FF_ISA_BASE off x86-64). */
ff_isa_tier ff_cpu_isa_tier(void);

/* The tier of an OpenBLAS core name ("Prescott", "Haswell", "Zen", ...), or -1 for a name this
 * table does not know. */
int ff_blas_core_tier(const char *core);

/* The core to ask OpenBLAS for, or NULL to keep `current`: a generic core of `cpu`'s tier when
 * `current` is a known core of a lower tier. */
const char *ff_blas_core_better(const char *current, ff_isa_tier cpu);

/* Re-executes the program (Linux: /proc/self/exe, the same argv) with OPENBLAS_CORETYPE set to
 * ff_blas_core_better(current, cpu), where that is not NULL. Returns only where it is NULL or
 * the re-execution fails (a warning on stderr; the run goes on with OpenBLAS's kernels). */
void ff_blas_core_restart(char **argv, const char *current, ff_isa_tier cpu);

/* At the top of main(), before MPI or any thread starts: ff_blas_core_restart() with
 * OpenBLAS's choice and this CPU's tier, unless OPENBLAS_CORETYPE is set or FF_BLAS_CORE=keep. */
void ff_blas_core_select(char **argv);

/* What the running OpenBLAS uses, for a log line: "Prescott", or "SkylakeX (chosen from CPUID;
 * OpenBLAS picked Prescott)" after ff_blas_core_select() re-executed. */
void ff_blas_core_describe(char *out, size_t cap);

#endif
