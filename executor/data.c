/* data.c — loading token files and text, and the sequence at (step, j); see data.h. */
#define _POSIX_C_SOURCE 200809L
#include "data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ff_status load_text(ff_data *data, const char *file, ff_diag *d) {
  FILE *f = fopen(file, "rb");
  if (!f) {
    ff_diag_error(d, NULL, "cannot open text: %s", strerror(errno));
    return FF_ERR_INPUT;
  }
  size_t cap = 1 << 16, n = 0;
  unsigned char *buf = malloc(cap);
  size_t got;
  while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      unsigned char *grown = realloc(buf, cap * 2);
      if (!grown) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = grown;
      cap *= 2;
    }
  }
  fclose(f);
  data->tokens = buf ? malloc((n ? n : 1) * sizeof *data->tokens) : NULL;
  if (!data->tokens) {
    free(buf);
    ff_diag_error(d, NULL, "out of memory reading text");
    return FF_ERR_RUNTIME;
  }
  for (size_t i = 0; i < n; i++)
    data->tokens[i] = buf[i];
  data->n = (int64_t)n;
  free(buf);
  return FF_OK;
}

static ff_status load_tokens(ff_data *data, const char *file, ff_diag *d) {
  FILE *f = fopen(file, "rb");
  if (!f) {
    ff_diag_error(d, NULL, "cannot open token file: %s", strerror(errno));
    return FF_ERR_INPUT;
  }
  int32_t header[256];
  if (fread(header, sizeof header, 1, f) != 1) {
    fclose(f);
    ff_diag_error(d, NULL, "token file shorter than its 1024-byte header");
    return FF_ERR_INPUT;
  }
  if (header[0] != FF_LLMC_MAGIC || header[1] != FF_LLMC_VERSION) {
    fclose(f);
    ff_diag_error(d, NULL, "not an llm.c token file (magic %d version %d; expected %d and %d)",
                  header[0], header[1], FF_LLMC_MAGIC, FF_LLMC_VERSION);
    return FF_ERR_INPUT;
  }
  int64_t n = header[2];
  if (n <= 0) {
    fclose(f);
    ff_diag_error(d, NULL, "token count %lld in the header is not positive", (long long)n);
    return FF_ERR_INPUT;
  }
  /* Check the header's count against the file before allocating for it. */
  long end = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  if (end < 0 || fseek(f, (long)sizeof header, SEEK_SET) != 0) {
    fclose(f);
    ff_diag_error(d, NULL, "cannot seek in the token file: %s", strerror(errno));
    return FF_ERR_INPUT;
  }
  int64_t held = (end - (long)sizeof header) / (int64_t)sizeof(uint16_t);
  if (held != n) {
    fclose(f);
    ff_diag_error(d, NULL, "header says %lld tokens but the file holds %lld", (long long)n,
                  (long long)held);
    return FF_ERR_INPUT;
  }
  uint16_t *raw = malloc((size_t)n * sizeof *raw);
  data->tokens = malloc((size_t)n * sizeof *data->tokens);
  if (!raw || !data->tokens) {
    fclose(f);
    free(raw);
    free(data->tokens);
    data->tokens = NULL;
    ff_diag_error(d, NULL, "out of memory for %lld tokens", (long long)n);
    return FF_ERR_RUNTIME;
  }
  size_t got = fread(raw, sizeof *raw, (size_t)n, f);
  fclose(f);
  if ((int64_t)got != n) {
    free(raw);
    free(data->tokens);
    data->tokens = NULL;
    ff_diag_error(d, NULL, "header says %lld tokens but the file holds %zu", (long long)n, got);
    return FF_ERR_INPUT;
  }
  for (int64_t i = 0; i < n; i++)
    data->tokens[i] = raw[i];
  data->n = n;
  free(raw);
  return FF_OK;
}

ff_status ff_data_load(ff_data *data, const char *file, int text, int64_t vocab, int64_t seq_len,
                       ff_diag *d) {
  memset(data, 0, sizeof *data);
  snprintf(data->source, sizeof data->source, "%s", file);
  const char *saved = d->file;
  d->file = file;
  ff_status st = text ? load_text(data, file, d) : load_tokens(data, file, d);
  if (st == FF_OK && data->n < seq_len + 1) {
    ff_diag_error(d, NULL, "%lld tokens is too short for one sequence of seq_len %lld (+1 target)",
                  (long long)data->n, (long long)seq_len);
    st = FF_ERR_INPUT;
  }
  for (int64_t i = 0; st == FF_OK && i < data->n; i++)
    if (data->tokens[i] < 0 || data->tokens[i] >= vocab) {
      ff_diag_error(d, NULL, "token %lld at position %lld is not below the model's vocab %lld%s",
                    (long long)data->tokens[i], (long long)i, (long long)vocab,
                    text ? " (text is read as bytes: the model needs vocab >= 256)" : "");
      st = FF_ERR_INPUT;
    }
  d->file = saved;
  if (st != FF_OK)
    ff_data_free(data);
  return st;
}

void ff_data_free(ff_data *data) {
  free(data->tokens);
  data->tokens = NULL;
  data->n = 0;
}

void ff_data_sequence(const ff_data *data, int64_t step, int64_t j, int64_t global_batch,
                      int64_t seq_len, int32_t *inputs, int32_t *targets) {
  uint64_t span = (uint64_t)(data->n - seq_len);
  uint64_t g = (uint64_t)step * (uint64_t)global_batch + (uint64_t)j;
  uint64_t offset = (g * (uint64_t)seq_len) % span;
  memcpy(inputs, data->tokens + offset, (size_t)seq_len * sizeof *inputs);
  memcpy(targets, data->tokens + offset + 1, (size_t)seq_len * sizeof *targets);
}
