/* test_model.c — the executor's model module (executor/model.c) on its own. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "model.h"

/* Initial weights are a function of (seed, tensor name, element index) alone: a shard large
 * enough to be filled by several threads holds exactly what the one-element generator gives,
 * for a tensor-parallel slice (rows or columns of the logical tensor) as for a whole one. */
static void initial_weights_follow_the_element_generator(void **state) {
  (void)state;
  ff_model m = {.name = "init-3m", .layers = 4, .hidden = 256, .heads = 4, .kv_heads = 2,
                .ffn_hidden = 688, .vocab = 256, .seq_len = 16, .norm_eps = 1e-5,
                .rope_theta = 10000};
  const ff_kernels *k = ff_kernels_cpu(1);
  ff_shard_spec specs[2] = {
      {0, m.layers, true, true, {0, m.heads}, {0, m.kv_heads}, {0, m.ffn_hidden}, {0, m.vocab}},
      {1, 3, false, true, {1, 3}, {1, 2}, {100, 500}, {64, 256}}};
  for (int sp = 0; sp < 2; sp++) {
    ff_model_rank mr;
    assert_int_equal(ff_model_rank_init(&mr, &m, k, &specs[sp], 1, 1, false, FF_RECOMPUTE_NONE),
                     FF_OK);
    if (sp == 0)
      assert_true(mr.n_params > 2 << 20); /* several parts of a million */
    ff_model_rank_init_weights(&mr, 77);
    int64_t checked = 0;
    for (int i = 0; i < mr.n_tensors; i++) {
      const ff_tensor *t = &mr.tensors[i];
      int64_t w = t->col_end - t->col_first;
      for (int64_t r = t->row_first; r < t->row_end; r++)
        for (int64_t c = t->col_first; c < t->col_end; c++) {
          float got = mr.params[t->offset + (r - t->row_first) * w + (c - t->col_first)];
          float want = t->init_std == 0
                           ? 1.0f
                           : (float)(t->init_std * ff_init_normal(77, t->name, r * t->cols + c));
          if (got != want)
            fail_msg("%s[%lld, %lld]: %g, not %g", t->name, (long long)r, (long long)c, got,
                     want);
          checked++;
        }
    }
    assert_int_equal(checked, mr.n_params);
    ff_model_rank_free(&mr);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(initial_weights_follow_the_element_generator),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
