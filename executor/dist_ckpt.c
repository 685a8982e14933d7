/* dist_ckpt.c — checkpoints of a plan of any shape: the logical tensors gathered on rank 0, one
 * at a time, and resuming from the newest intact one. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "hf_init.h"
#include "dist_internal.h"

static int checkpoint_tag(int segment, int block) {
  return 16384 + (int)(((int64_t)segment * 4 + block) % 16384);
}


/* ---- checkpoints: gather the logical tensors on rank 0 ---------------------------------- */

/* Every segment's owner (its holder in pipeline 0) sends parameters and moments to rank 0, one
 * logical tensor after another in the checkpoint's order; rank 0 assembles each tensor in
 * `whole` (the largest tensor's size) and appends it to the file, so no rank ever holds more of
 * the model than its own shard and one tensor. Segments of a tensor go in the order of d->segs,
 * which every rank walks the same way: sends and receives pair up without deadlock. A rank 0
 * that cannot write goes on receiving, so the others are not left waiting. */
ff_status ff_dist_save(dist *d, int64_t step, float *buf, float *whole) {
  ff_model_rank layout; /* the logical tensors in checkpoint order */
  ff_shard_spec spec = {0, d->plan->model.layers, true, true, {0, d->plan->model.heads},
                        {0, d->plan->model.kv_heads}, {0, d->plan->model.ffn_hidden},
                        {0, d->plan->model.vocab}};
  if (ff_model_rank_init_layout(&layout, &d->plan->model, &spec) != FF_OK)
    d->c->abort(FF_ERR_RUNTIME);
  int *desc_of = malloc((size_t)layout.n_tensors * sizeof *desc_of);
  if (!desc_of)
    d->c->abort(FF_ERR_RUNTIME);
  for (int i = 0; i < layout.n_tensors; i++) {
    desc_of[i] = -1;
    for (int j = 0; j < d->n_tds && desc_of[i] < 0; j++)
      if (strcmp(d->tds[j].name, layout.tensors[i].name) == 0)
        desc_of[i] = j;
    if (desc_of[i] < 0) {
      fprintf(stderr, "ffrun: internal error: %s has no segments\n", layout.tensors[i].name);
      d->c->abort(FF_ERR_RUNTIME);
    }
  }
  bool root = d->rank == 0;
  ff_ckpt_meta meta = {step, (uint64_t)d->plan->training.seed, "", ""};
  snprintf(meta.model_name, sizeof meta.model_name, "%s", d->plan->model.name);
  snprintf(meta.model_digest, sizeof meta.model_digest, "%s", d->model_digest);
  ff_diag dg;
  ff_diag_init(&dg, d->o->checkpoint_dir);
  ff_ckpt_writer *w = NULL;
  if (root) {
    mkdir(d->o->checkpoint_dir, 0755);
    w = ff_checkpoint_begin(d->o->checkpoint_dir, &layout, &meta, d->o->checkpoint_gradients, &dg);
  }
  /* parameters, both moments and, with --checkpoint-gradients, the step's summed gradients */
  float *blocks[4] = {d->mr.params, d->mr.m, d->mr.v, d->mr.grads};
  for (int b = 0; b < (d->o->checkpoint_gradients ? 4 : 3); b++) {
    float *mine = ff_dist_host_block_get(d, blocks[b]);
    for (int i = 0; i < layout.n_tensors; i++) {
      ff_tensor t = layout.tensors[i]; /* whole, at the start of `whole` */
      t.offset = 0;
      for (int k = 0; k < d->n_segs; k++) {
        seg *sg = &d->segs[k];
        if (sg->desc != desc_of[i])
          continue;
        int tag = checkpoint_tag(k, b);
        if (sg->owner == d->rank) {
          int64_t n = ff_dist_seg_pack(d, sg, mine, buf, true);
          if (!root)
            d->c->wait(d->c->isend(buf, (size_t)n * sizeof *buf, 0, tag));
        }
        if (!root)
          continue;
        if (sg->owner != 0)
          d->c->recv(buf, (size_t)(sg->b - sg->a) * (size_t)(sg->cols ? t.rows : t.cols) *
                              sizeof *buf, sg->owner, tag);
        ff_dist_pack(&t, sg, whole, buf, false);
      }
      if (w)
        ff_checkpoint_append(w, whole, (size_t)(t.rows * t.cols) * sizeof *whole);
    }
  }
  char path[4096];
  ff_status st = root ? ff_checkpoint_end(w, true, &dg, path, sizeof path) : FF_OK;
  if (root) {
    ff_diag_print(&dg, stderr);
    if (st == FF_OK && !d->o->quiet)
      fprintf(stderr, "checkpoint: %s\n", path);
  }
  ff_diag_free(&dg);
  free(desc_of);
  ff_model_rank_free(&layout);
  int ok = st == FF_OK;
  d->c->bcast(d->world, &ok, sizeof ok, 0);
  return ok ? FF_OK : FF_ERR_RUNTIME;
}

/* Every rank loads its slices from the newest checkpoint that reads back intact. */
ff_status ff_dist_resume(dist *d, int64_t *done) {
  long long steps[4096];
  int n = ff_checkpoint_list(d->o->checkpoint_dir, steps, 4096);
  *done = 0;
  for (int i = 0; i < n; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/step-%08lld.safetensors", d->o->checkpoint_dir, steps[i]);
    ff_ckpt_meta meta;
    ff_diag dg;
    ff_diag_init(&dg, path);
    ff_status st = ff_checkpoint_load(path, &d->mr, d->model_digest, &meta, &dg);
    if (d->rank == 0)
      ff_diag_print(&dg, stderr);
    bool other_model = strstr(ff_diag_text(&dg), "model_digest") != NULL;
    ff_diag_free(&dg);
    float bad = st == FF_OK ? 0.0f : 1.0f; /* every rank must agree on the file */
    d->c->allreduce_sum(d->world, &bad, 1);
    if (bad == 0.0f) {
      *done = meta.step;
      if (d->rank == 0 && !d->o->quiet)
        fprintf(stderr, "ffrun: resumed from %s at step %lld\n", path, (long long)meta.step);
      return FF_OK;
    }
    if (other_model)
      return FF_ERR_INPUT;
    if (d->rank == 0)
      fprintf(stderr, "ffrun: %s cannot be used; trying an older checkpoint\n", path);
  }
  if (n > 0) {
    if (d->rank == 0)
      fprintf(stderr, "ffrun: no intact checkpoint in %s\n", d->o->checkpoint_dir);
    return FF_ERR_INPUT;
  }
  return FF_OK;
}

ff_status ff_dist_init_from(dist *d) {
  const char *dir = d->o->init_from;
  ff_diag dg;
  ff_diag_init(&dg, dir);
  ff_status st = ff_hf_check_config(dir, &d->plan->model, &dg);
  if (d->rank == 0) /* the same on every rank */
    ff_diag_print(&dg, stderr);
  ff_diag_free(&dg);
  if (st == FF_OK) {
    ff_diag_init(&dg, dir);
    st = ff_hf_load(dir, &d->mr, &dg);
    ff_diag_print(&dg, stderr); /* a rank's own tensors: each says what it could not read */
    ff_diag_free(&dg);
  }
  float bad = st == FF_OK ? 0.0f : 1.0f; /* every rank must have its weights */
  d->c->allreduce_sum(d->world, &bad, 1);
  if (bad != 0.0f)
    return st == FF_ERR_RUNTIME ? FF_ERR_RUNTIME : FF_ERR_INPUT;
  if (d->rank == 0 && !d->o->quiet)
    fprintf(stderr, "ffrun: initial weights from %s\n", dir);
  return FF_OK;
}
