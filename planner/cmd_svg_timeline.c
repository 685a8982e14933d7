/* cmd_svg_timeline.c — the --timeline part of `ffplan svg`: each pipeline's schedule run by the
 * cost model's simulator (cost/ff_sim.c), recording when each forward and backward starts and
 * ends, and drawn as a Gantt chart with one lane per stage. At most MAX_PIPES pipelines and the
 * first MAX_MB micro-batches of each are drawn. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_svg.h"

#define LANE_H 16.0
enum { MAX_MB = 32, MAX_PIPES = 16 };

/* One replayed operation: micro-batch mb, forward or backward, [start, end). */
typedef struct tl_op {
  double start, end;
  int mb;
  bool bwd;
} tl_op;

typedef struct tl_pipe {
  int p; /* stages */
  int m; /* micro-batches replayed: min(micro_batches, MAX_MB) */
  double makespan;
  tl_op *ops; /* stage i's ops at ops[i * 2m ...], in the order the stage runs them */
} tl_pipe;

/* ---- the replay ------------------------------------------------------------------------- */

typedef struct tl_rec {
  int *n_ops;
  tl_pipe *out;
} tl_rec;

static void tl_record(void *ctx, int stage, int64_t mb, bool bwd, double start, double end) {
  tl_rec *r = ctx;
  r->out->ops[(size_t)stage * 2 * (size_t)r->out->m + (size_t)r->n_ops[stage]++] =
      (tl_op){start, end, (int)mb, bwd};
}

/* Replay pipeline pi's schedule for its first min(m, MAX_MB) micro-batches, through the cost
 * model's own simulator (cost/ff_sim.c), which reports each operation as it runs it. */
static ff_status tl_replay(const ff_plan *plan, const ff_plan_eval *e, int pi, tl_pipe *out) {
  const ff_pipeline_eval *pe = &e->pipelines[pi];
  int n = plan->pipelines[pi].n_stages;
  int64_t mb = plan->pipelines[pi].micro_batches;
  out->p = n;
  out->m = mb < MAX_MB ? (int)mb : MAX_MB;
  double *buf = malloc((size_t)n * 4 * sizeof *buf);
  int *n_ops = calloc((size_t)n, sizeof *n_ops);
  out->ops = malloc(2 * (size_t)n * (size_t)out->m * sizeof *out->ops);
  if (!buf || !n_ops || !out->ops) {
    free(buf), free(n_ops);
    fprintf(stderr, "ffplan svg: out of memory replaying pipeline %d\n", pi);
    return FF_ERR_RUNTIME;
  }
  ff_stage_sim_inputs(pe, n, buf);
  tl_rec rec = {n_ops, out};
  out->makespan = ff_sim_pipeline_observed(plan->training.schedule, e->transfers, n, out->m, buf,
                                           buf + n, buf + 2 * n, buf + 3 * n, NULL, NULL, NULL,
                                           tl_record, &rec);
  free(buf), free(n_ops);
  if (out->makespan < 0) {
    fprintf(stderr, "ffplan svg: out of memory replaying pipeline %d\n", pi);
    return FF_ERR_RUNTIME;
  }
  return FF_OK;
}

/* ---- the drawing ------------------------------------------------------------------------ */

/* Grid lines over [top, bottom) and tick labels under bottom, for a time axis 0..T seconds. */
static void draw_axis(svg *s, double x0, double cw, double top, double bottom, double T) {
  double unit = T < 1.0 ? 1e3 : 1.0, tu = T * unit, raw = tu / 8, mag = 1.0;
  while (mag * 10 <= raw)
    mag *= 10;
  while (mag > raw)
    mag /= 10;
  double step = raw <= mag ? mag : raw <= 2 * mag ? 2 * mag : raw <= 5 * mag ? 5 * mag : 10 * mag;
  int decimals = step >= 1 ? 0 : step >= 0.1 ? 1 : step >= 0.01 ? 2 : 3;
  for (int k = 0; k <= 20 && k * step <= tu * (1 + 1e-9); k++) {
    double x = x0 + k * step / tu * cw;
    ff_buf_printf(&s->b, "<path d=\"M%.1f %.1fV%.1f\" stroke=\"#cccccc\" stroke-width=\"0.5\"/>\n",
                  x, top, bottom + 3);
    svg_text(s, x, bottom + 13, "text-anchor=\"middle\" font-size=\"9\" fill=\"#555555\"", "%.*f",
             decimals, k * step);
  }
  svg_text(s, MARGIN + PAD, bottom + 13, "font-size=\"9\" fill=\"#555555\"", "time (%s)",
           unit == 1.0 ? "s" : "ms");
}

static void draw_op(const svg_view *v, const tl_op *op, int device, double x0, double cw, double T,
                    double y) {
  svg *s = v->s;
  double x = x0 + op->start / T * cw, w = (op->end - op->start) / T * cw;
  svg_rect(s, x, y, w, LANE_H, op->bwd ? svg_stroke(device) : svg_fill(device), "#ffffff",
           op->bwd ? "class=\"op b\" stroke-width=\"0.5\"" : "class=\"op f\" stroke-width=\"0.5\"");
  char label[16];
  snprintf(label, sizeof label, "%d", op->mb);
  if (w >= svg_text_w(label, SMALL_W) + 3)
    svg_text(s, x + w / 2, y + 12,
             op->bwd ? "text-anchor=\"middle\" font-size=\"9\" fill=\"#ffffff\""
                     : "text-anchor=\"middle\" font-size=\"9\"",
             "%s", label);
}

static void draw_schedule(const svg_view *v, int pi, const tl_pipe *tp, double T) {
  svg *s = v->s;
  const ff_plan_pipeline *pl = &v->plan->pipelines[pi];
  double x0 = MARGIN + LABEL_W, cw = s->width - MARGIN - x0;
  s->y += LINE_H + GAP;
  svg_text(s, MARGIN, s->y, "font-weight=\"bold\"",
           "pipeline %d: %lld micro-batch%s, makespan %.4f s", pi, (long long)pl->micro_batches,
           pl->micro_batches == 1 ? "" : "es", v->e->pipelines[pi].seconds);
  if (tp->m < pl->micro_batches) {
    s->y += LINE_H;
    svg_text(s, MARGIN, s->y, "fill=\"#555555\"",
             "drawn: the first %d micro-batches, replayed as a schedule of their own (same "
             "order and stage times, %.4f s)",
             tp->m, tp->makespan);
  }
  double top = s->y + GAP;
  for (int i = 0; i < tp->p; i++) {
    double y = top + i * (LANE_H + 2);
    int dev = pl->stages[i].ranks[0].device;
    svg_rect(s, MARGIN + PAD, y + 3, 10, 10, svg_fill(dev), svg_stroke(dev), "");
    svg_text(s, MARGIN + PAD + 16, y + 12, "", "stage %d", i);
    svg_rect(s, x0, y, cw, LANE_H, "#eeeeee", NULL, "class=\"lane\"");
  }
  double bottom = top + tp->p * (LANE_H + 2) - 2;
  draw_axis(s, x0, cw, top, bottom, T);
  for (int i = 0; i < tp->p; i++)
    for (int k = 0; k < 2 * tp->m; k++)
      draw_op(v, &tp->ops[(size_t)i * 2 * tp->m + k], pl->stages[i].ranks[0].device, x0, cw, T,
              top + i * (LANE_H + 2));
  s->y = bottom + 16 + GAP;
}

ff_status svg_draw_timeline(const svg_view *v) {
  svg *s = v->s;
  int n = v->plan->n_pipelines < MAX_PIPES ? v->plan->n_pipelines : MAX_PIPES;
  tl_pipe tp[MAX_PIPES] = {{0}};
  ff_status st = FF_OK;
  double T = 0;
  for (int p = 0; p < n && st == FF_OK; p++) {
    st = tl_replay(v->plan, v->e, p, &tp[p]);
    T = svg_max(T, tp[p].makespan);
    /* Replayed in full, the schedule must end exactly when the cost model's simulation does. */
    if (st == FF_OK && tp[p].m == v->plan->pipelines[p].micro_batches &&
        tp[p].makespan != v->e->pipelines[p].seconds) {
      fprintf(stderr,
              "ffplan svg: internal error: pipeline %d replays to %.9g s, the simulator says "
              "%.9g s\n",
              p, tp[p].makespan, v->e->pipelines[p].seconds);
      st = FF_ERR_RUNTIME;
    }
  }
  if (st == FF_OK) {
    svg_heading(s,
                v->plan->training.schedule == FF_SCHEDULE_GPIPE ? "simulated schedule (GPipe)"
                                                                : "simulated schedule (1F1B)",
                "one lane per stage; light: forward, dark: backward, numbered by micro-batch; "
                "grey gaps: bubbles; one time axis for all pipelines");
    for (int p = 0; p < n; p++)
      draw_schedule(v, p, &tp[p], T > 0 ? T : 1.0);
    if (v->plan->n_pipelines > n) {
      s->y += LINE_H;
      svg_text(s, MARGIN, s->y, "", "… %d more pipeline%s not drawn", v->plan->n_pipelines - n,
               v->plan->n_pipelines - n == 1 ? "" : "s");
    }
  }
  for (int p = 0; p < n; p++)
    free(tp[p].ops);
  return st;
}
