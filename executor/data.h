/* data.h — training data: llm.c token files (a 256-int32 header: magic and version, which say the
 * token width, and the token count; then the tokens: magic 20240520 version 1 uint16, llm.c's
 * GPT-2 files; magic 20240801 version 7 uint32, its Llama-3 files, for vocabularies past 65,536)
 * or plain text read as bytes (a byte-level tokenizer, vocab 256). Sequence j of the global batch at step t is a pure function of (t, j): the tokens at
 * offset ((t·global_batch + j)·S) mod (n − S), so every plan feeds every pipeline the same data. */
#ifndef FF_EXEC_DATA_H
#define FF_EXEC_DATA_H

#include <stdint.h>

#include "ff_diag.h"
#include "ff_status.h"

#define FF_LLMC_MAGIC 20240520 /* uint16 tokens */
#define FF_LLMC_VERSION 1
#define FF_LLMC_MAGIC_U32 20240801 /* uint32 tokens */
#define FF_LLMC_VERSION_U32 7

typedef struct ff_data {
  int32_t *tokens;
  int64_t n;
  char source[512];
} ff_data;

/* Load a token file (text = 0) or a text file (text = 1), checking every token is < vocab and
 * that the data holds at least one sequence of seq_len + 1 tokens. */
ff_status ff_data_load(ff_data *data, const char *file, int text, int64_t vocab, int64_t seq_len,
                       ff_diag *d);
void ff_data_free(ff_data *data);
/* Inputs and targets (seq_len each) of global sequence (step, j). step counts from 0. */
void ff_data_sequence(const ff_data *data, int64_t step, int64_t j, int64_t global_batch,
                      int64_t seq_len, int32_t *inputs, int32_t *targets);

#endif
