/* replay.c — run a fuzz target's committed corpus without libFuzzer: every file named on the
 * command line (or in the directories named) through LLVMFuzzerTestOneInput. Built by meson
 * with the sanitizers of the build, so the regression test is as strict as the fuzzing was. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return 1;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  size_t got = buf ? fread(buf, 1, (size_t)n, f) : 0;
  fclose(f);
  LLVMFuzzerTestOneInput(buf, got);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int files = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
      DIR *d = opendir(argv[i]);
      struct dirent *e;
      while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
          continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
        files += run_file(path) == 0;
      }
      if (d)
        closedir(d);
    } else {
      files += run_file(argv[i]) == 0;
    }
  }
  fprintf(stderr, "replayed %d inputs\n", files);
  return files > 0 ? 0 : 1;
}
