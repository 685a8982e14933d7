/* test_bad_inputs.c — the bad-input corpus: tests/data/bad/NAME.json holds one defect and
 * NAME.expect the message(s) it must produce, one per line, each of which must appear in the
 * diagnostics. Every case must be rejected with FF_ERR_INPUT (exit status 2). Files without an
 * .expect beside them are helpers that cases refer to (a bad device file, say). */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ff_format.h"

#define CORPUS "tests/data/bad"

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_case(const char *stem) {
  char file[1024], expect_file[1024];
  snprintf(file, sizeof file, CORPUS "/%s.json", stem);
  snprintf(expect_file, sizeof expect_file, CORPUS "/%s.expect", stem);
  ff_diag d;
  ff_diag_init(&d, file);
  char *expect = NULL;
  size_t len = 0;
  if (ff_read_file(expect_file, &d, &expect, &len) != FF_OK) {
    fprintf(stderr, "%s: cannot read\n", expect_file);
    ff_diag_free(&d);
    return 1;
  }
  ff_diag_free(&d);
  ff_diag_init(&d, file);
  char summary[1024];
  ff_status st = ff_validate_file(file, &d, summary, sizeof summary);
  int failures = 0;
  if (st != FF_ERR_INPUT) {
    fprintf(stderr, "%s: status %d, expected %d (bad input)\n", file, st, FF_ERR_INPUT);
    failures++;
  }
  char *save = NULL;
  for (char *line = strtok_r(expect, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (!*line)
      continue;
    if (!strstr(ff_diag_text(&d), line)) {
      fprintf(stderr, "%s: expected message not found:\n  want: %s\n  got:  %s", file, line,
              ff_diag_text(&d));
      failures++;
    }
  }
  free(expect);
  ff_diag_free(&d);
  return failures;
}

static void every_bad_input_is_rejected_with_its_message(void **state) {
  (void)state;
  DIR *dir = opendir(CORPUS);
  assert_non_null(dir);
  char *stems[4096];
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dir)) && n < 4096) {
    size_t len = strlen(e->d_name);
    if (len > 7 && strcmp(e->d_name + len - 7, ".expect") == 0)
      stems[n++] = strndup(e->d_name, len - 7);
  }
  closedir(dir);
  qsort(stems, (size_t)n, sizeof *stems, cmp_str);
  int failures = 0;
  for (int i = 0; i < n; i++) {
    failures += run_case(stems[i]);
    free(stems[i]);
  }
  printf("bad-input corpus: %d cases, %d failures\n", n, failures);
  assert_int_equal(failures, 0);
  assert_true(n >= 60);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_bad_input_is_rejected_with_its_message),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
