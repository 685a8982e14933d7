/* test_profiles.c — every shipped profile validates and is already in canonical form, so that
 * read -> write gives the same bytes, and a second round (write -> read -> write) is stable. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ff_format.h"

static const char *const folders[] = {"profiles/devices", "profiles/clusters", "profiles/models",
                                      "profiles/training", "profiles/plans"};

static int check_folder(const char *folder, int *files) {
  DIR *dir = opendir(folder);
  assert_non_null(dir);
  struct dirent *e;
  int failures = 0;
  while ((e = readdir(dir))) {
    size_t n = strlen(e->d_name);
    if (n < 6 || strcmp(e->d_name + n - 5, ".json") != 0)
      continue;
    char file[1024];
    snprintf(file, sizeof file, "%s/%s", folder, e->d_name);
    (*files)++;
    ff_diag d;
    ff_diag_init(&d, file);
    ff_buf canon = {0};
    ff_format_kind kind;
    char summary[1024];
    if (ff_validate_file(file, &d, summary, sizeof summary) != FF_OK ||
        ff_canonical_text(file, &d, &canon, &kind) != FF_OK) {
      fprintf(stderr, "%s", ff_diag_text(&d));
      failures++;
    } else {
      char *text = NULL;
      size_t len = 0;
      assert_int_equal(ff_read_file(file, &d, &text, &len), FF_OK);
      if (len != canon.len || memcmp(text, canon.data, len) != 0) {
        fprintf(stderr, "%s: not byte-identical to its canonical form (ffplan fmt --in-place)\n",
                file);
        failures++;
      }
      free(text);
    }
    ff_buf_free(&canon);
    ff_diag_free(&d);
  }
  closedir(dir);
  return failures;
}

static void every_shipped_profile_validates_and_round_trips(void **state) {
  (void)state;
  int files = 0, failures = 0;
  for (size_t i = 0; i < sizeof folders / sizeof *folders; i++)
    failures += check_folder(folders[i], &files);
  assert_int_equal(failures, 0);
  assert_true(files >= 35); /* 17+ devices, 7 models, 3 training, 8 clusters, plans */
}

static void shipped_device_set_is_complete(void **state) {
  (void)state;
  static const char *const required[] = {
      "h200-sxm", "h100-sxm5", "h100-pcie", "a100-sxm4-80gb", "a100-pcie-80gb", "a100-sxm4-40gb",
      "a800-sxm4-80gb", "l40s", "l40", "rtx-a6000", "a10", "l4", "rtx-4090", "rtx-3090",
      "rtx-3080ti", "v100-sxm2-32gb", "t4"};
  for (size_t i = 0; i < sizeof required / sizeof *required; i++) {
    char file[256];
    snprintf(file, sizeof file, "profiles/devices/%s.json", required[i]);
    ff_diag d;
    ff_device dev;
    ff_diag_init(&d, file);
    assert_int_equal(ff_load_device(file, &d, &dev), FF_OK);
    /* Dense peaks: never above a sparsity figure's half for any shipped part (< 1000). */
    assert_true(dev.peak_tflops[FF_DTYPE_FP16] < 1000);
    assert_true(dev.source && strlen(dev.source) > 20);
    ff_device_free(&dev);
    ff_diag_free(&d);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_shipped_profile_validates_and_round_trips),
      cmocka_unit_test(shipped_device_set_is_complete),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
