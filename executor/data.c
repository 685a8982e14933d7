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

/* Tokens of `width` bytes (2 or 4, little-endian as llm.c writes them) into int32. */
static ff_status read_tokens(ff_data *data, FILE *f, int64_t n, int width, int64_t vocab,
                             ff_diag *d) {
  data->tokens = malloc((size_t)n * sizeof *data->tokens);
  if (!data->tokens) {
    ff_diag_error(d, NULL, "out of memory for %lld tokens", (long long)n);
    return FF_ERR_RUNTIME;
  }
  enum { CHUNK = 1 << 14 }; /* tokens read at a time: 64 KiB of uint32 on the stack */
  unsigned char raw[CHUNK * 4];
  for (int64_t at = 0; at < n;) {
    size_t want = (size_t)(n - at < CHUNK ? n - at : CHUNK);
    size_t got = fread(raw, (size_t)width, want, f);
    for (size_t i = 0; i < got; i++) {
      const unsigned char *b = raw + i * (size_t)width;
      uint32_t v = (uint32_t)b[0] | (uint32_t)b[1] << 8;
      if (width == 4) v |= (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
      if ((int64_t)v >= vocab) {
        ff_diag_error(d, NULL, "token %llu at position %lld is not below the model's vocab %lld",
                      (unsigned long long)v, (long long)(at + (int64_t)i), (long long)vocab);
        return FF_ERR_INPUT;
      }
      data->tokens[at + (int64_t)i] = (int32_t)v;
    }
    if (got != want) {
      ff_diag_error(d, NULL, "header says %lld tokens but the file holds %lld", (long long)n,
                    (long long)(at + (int64_t)got));
      return FF_ERR_INPUT;
    }
    at += (int64_t)got;
  }
  return FF_OK;
}

static ff_status load_tokens(ff_data *data, const char *file, int64_t vocab, ff_diag *d) {
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
  int width = header[0] == FF_LLMC_MAGIC && header[1] == FF_LLMC_VERSION           ? 2
              : header[0] == FF_LLMC_MAGIC_U32 && header[1] == FF_LLMC_VERSION_U32 ? 4
                                                                                   : 0;
  if (!width) {
    fclose(f);
    ff_diag_error(d, NULL,
                  "not an llm.c token file (magic %d version %d; expected %d and %d for uint16 "
                  "tokens, or %d and %d for uint32)",
                  header[0], header[1], FF_LLMC_MAGIC, FF_LLMC_VERSION, FF_LLMC_MAGIC_U32,
                  FF_LLMC_VERSION_U32);
    return FF_ERR_INPUT;
  }
  if (width == 2 && vocab > 65536) {
    fclose(f);
    ff_diag_error(d, NULL,
                  "holds uint16 tokens (magic %d), which cannot name the model's vocab of %lld; "
                  "tokenize it again into uint32 tokens (magic %d version %d: "
                  "scripts/prepare-data writes them for vocabularies past 65,536)",
                  FF_LLMC_MAGIC, (long long)vocab, FF_LLMC_MAGIC_U32, FF_LLMC_VERSION_U32);
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
  int64_t bytes = end - (long)sizeof header;
  if (bytes != n * width) {
    fclose(f);
    ff_diag_error(d, NULL, "header says %lld tokens of %d bytes but the file holds %lld bytes of "
                  "tokens%s", (long long)n, width, (long long)bytes,
                  bytes % width ? " (not a whole number of tokens)" : "");
    return FF_ERR_INPUT;
  }
  ff_status st = read_tokens(data, f, n, width, vocab, d);
  fclose(f);
  if (st != FF_OK) {
    free(data->tokens);
    data->tokens = NULL;
    return st;
  }
  data->n = n;
  return FF_OK;
}

ff_status ff_data_load(ff_data *data, const char *file, int text, int64_t vocab, int64_t seq_len,
                       ff_diag *d) {
  memset(data, 0, sizeof *data);
  snprintf(data->source, sizeof data->source, "%s", file);
  const char *saved = d->file;
  d->file = file;
  ff_status st = text ? load_text(data, file, d) : load_tokens(data, file, vocab, d);
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
