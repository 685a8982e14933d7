/* cmd_svg.c — `ffplan svg PLAN -o FILE.svg [--timeline]`: a self-contained drawing of a plan for
 * review: a title with the cost model's predictions, a legend of device types, one row per
 * pipeline with its stages left to right (each stage's TP group of GPUs inside a box of its
 * node), the cluster's nodes with the rank on each GPU, and with --timeline the simulated
 * schedule (cmd_svg_timeline.c). The same plan always gives the same bytes. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd_review.h"
#include "cmd_svg.h"
#include "ffplan_cmds.h"

#define GPU_H 30.0
#define CELL_H 18.0
#define STAGE_GAP 22.0 /* between stage boxes: room for the arrow */
#define MIN_WIDTH 960.0
#define STAGE_LINES 4
#define LINE_CAP 96
enum {
  GPUS_PER_ROW = 8,
  STAGES_PER_LINE = 8,
  NODE_COLS = 8,
  MAX_NODES = 64,
  MAX_NODE_GPUS = 64,
  N_COLOURS = 10
};

static const char *const fills[N_COLOURS] = {"#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
                                             "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#c7c7c7"};
static const char *const strokes[N_COLOURS] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                               "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
                                               "#17becf", "#7f7f7f"};

/* ---- SVG primitives --------------------------------------------------------------------- */

void svg_escaped(ff_buf *b, const char *t) {
  for (; *t; t++) {
    switch (*t) {
    case '<': ff_buf_puts(b, "&lt;"); break;
    case '>': ff_buf_puts(b, "&gt;"); break;
    case '&': ff_buf_puts(b, "&amp;"); break;
    case '"': ff_buf_puts(b, "&quot;"); break;
    case '\'': ff_buf_puts(b, "&apos;"); break;
    default: ff_buf_put(b, t, 1);
    }
  }
}

void svg_text(svg *s, double x, double y, const char *attrs, const char *fmt, ...) {
  char t[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t, sizeof t, fmt, ap);
  va_end(ap);
  ff_buf_printf(&s->b, "<text x=\"%.1f\" y=\"%.1f\"%s%s>", x, y, attrs[0] ? " " : "", attrs);
  svg_escaped(&s->b, t);
  ff_buf_puts(&s->b, "</text>\n");
}

void svg_rect(svg *s, double x, double y, double w, double h, const char *fill, const char *stroke,
              const char *attrs) {
  ff_buf_printf(&s->b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"", x,
                y, w, h, fill);
  if (stroke)
    ff_buf_printf(&s->b, " stroke=\"%s\"", stroke);
  ff_buf_printf(&s->b, "%s%s/>\n", attrs[0] ? " " : "", attrs);
}

double svg_text_w(const char *t, double char_w) { return (double)strlen(t) * char_w; }
double svg_max(double a, double b) { return a > b ? a : b; }
const char *svg_fill(int device) { return fills[device % N_COLOURS]; }
const char *svg_stroke(int device) { return strokes[device % N_COLOURS]; }

void svg_heading(svg *s, const char *title, const char *note) {
  s->y += LINE_H + GAP;
  svg_text(s, MARGIN, s->y, "font-size=\"13\" font-weight=\"bold\"", "%s", title);
  if (note) {
    s->y += LINE_H;
    svg_text(s, MARGIN, s->y, "fill=\"#555555\"", "%s", note);
  }
  s->y += GAP * 2;
}

/* Milliseconds with three significant digits or more: "0.583", "73.8", "158". */
static void fmt_ms(double seconds, char *out, size_t cap) {
  double ms = seconds * 1e3;
  snprintf(out, cap, ms < 10 ? "%.3f" : ms < 100 ? "%.1f" : "%.0f", ms);
}

/* ---- the stages of a pipeline ----------------------------------------------------------- */

/* The rank of a stage with the most memory (a stage's ranks share one device type). */
static const ff_rank_eval *stage_peak_rank(const svg_view *v, const ff_plan_stage *st) {
  const ff_rank_eval *best = &v->e->ranks[st->ranks[0].rank];
  for (int t = 1; t < st->n_ranks; t++)
    if (v->e->ranks[st->ranks[t].rank].memory_total_bytes > best->memory_total_bytes)
      best = &v->e->ranks[st->ranks[t].rank];
  return best;
}

static void stage_lines(const svg_view *v, int p, int s, char lines[STAGE_LINES][LINE_CAP]) {
  const ff_plan_stage *st = &v->plan->pipelines[p].stages[s];
  const ff_stage_eval *se = &v->e->pipelines[p].stages[s];
  const ff_rank_eval *peak = stage_peak_rank(v, st);
  char f[32], b[32];
  fmt_ms(se->fwd_seconds, f, sizeof f);
  fmt_ms(se->bwd_seconds, b, sizeof b);
  snprintf(lines[0], LINE_CAP, "stage %d  TP %d", s, st->n_ranks);
  snprintf(lines[1], LINE_CAP, "layers [%lld,%lld)%s%s", (long long)st->layers.first,
           (long long)st->layers.end, st->embedding ? " +emb" : "", st->lm_head ? " +head" : "");
  snprintf(lines[2], LINE_CAP, "mem %.2f/%.2f GiB%s", peak->memory_total_bytes / FF_GIB,
           peak->capacity_bytes / FF_GIB,
           peak->memory_total_bytes > peak->capacity_bytes ? " OVER" : "");
  snprintf(lines[3], LINE_CAP, "fwd %s bwd %s ms", f, b);
}

static int gpu_rows(const ff_plan_stage *st) {
  return (st->n_ranks + GPUS_PER_ROW - 1) / GPUS_PER_ROW;
}

static double node_box_h(const ff_plan_stage *st) {
  return LINE_H + gpu_rows(st) * (GPU_H + GAP) + GAP;
}

static double stage_h(const ff_plan_stage *st) {
  return PAD + STAGE_LINES * LINE_H + GAP + node_box_h(st) + PAD;
}

static double stage_w(const svg_view *v, int p, int s) {
  const ff_plan_stage *st = &v->plan->pipelines[p].stages[s];
  char lines[STAGE_LINES][LINE_CAP];
  stage_lines(v, p, s, lines);
  double w = 0;
  for (int k = 0; k < STAGE_LINES; k++)
    w = svg_max(w, svg_text_w(lines[k], CHAR_W));
  int cols = st->n_ranks < GPUS_PER_ROW ? st->n_ranks : GPUS_PER_ROW;
  w = svg_max(w, cols * (v->gpu_w + GAP) + GAP);
  w = svg_max(w, svg_text_w(v->plan->cluster.nodes[st->ranks[0].node].name, CHAR_W) + 2 * GAP);
  return w + 2 * PAD;
}

/* Stages [first, first + n) of pipeline p drawn on one line: their width with the gaps. */
static double line_w(const svg_view *v, int p, int first, int n) {
  double w = 0;
  for (int s = first; s < first + n; s++)
    w += stage_w(v, p, s) + (s > first ? STAGE_GAP : 0);
  return w;
}

static double line_h(const svg_view *v, int p, int first, int n) {
  double h = 0;
  for (int s = first; s < first + n; s++)
    h = svg_max(h, stage_h(&v->plan->pipelines[p].stages[s]));
  return h;
}

static void draw_gpus(const svg_view *v, const ff_plan_stage *st, double x, double y, double w) {
  svg *s = v->s;
  int dev = st->ranks[0].device;
  svg_rect(s, x, y, w, node_box_h(st), "#ffffff", svg_stroke(dev), "class=\"node\" rx=\"3\"");
  svg_text(s, x + GAP, y + LINE_H - 3, "font-size=\"10\"", "%s",
           v->plan->cluster.nodes[st->ranks[0].node].name);
  for (int t = 0; t < st->n_ranks; t++) {
    const ff_plan_rank *r = &st->ranks[t];
    double gx = x + GAP + (t % GPUS_PER_ROW) * (v->gpu_w + GAP);
    double gy = y + LINE_H + (t / GPUS_PER_ROW) * (GPU_H + GAP);
    const ff_rank_eval *re = &v->e->ranks[r->rank];
    bool over = re->memory_total_bytes > re->capacity_bytes;
    svg_rect(s, gx, gy, v->gpu_w, GPU_H, svg_fill(r->device),
             over ? "#d62728" : svg_stroke(r->device),
             over ? "class=\"gpu\" rx=\"2\" stroke-width=\"2\"" : "class=\"gpu\" rx=\"2\"");
    svg_text(s, gx + v->gpu_w / 2, gy + 12, "text-anchor=\"middle\" font-weight=\"bold\"", "r%lld",
             (long long)r->rank);
    svg_text(s, gx + v->gpu_w / 2, gy + 25, "text-anchor=\"middle\" font-size=\"9\"", "gpu %d",
             r->gpu);
  }
}

static void draw_stage(const svg_view *v, int p, int si, double x, double y, double h) {
  svg *s = v->s;
  const ff_plan_stage *st = &v->plan->pipelines[p].stages[si];
  double w = stage_w(v, p, si);
  char lines[STAGE_LINES][LINE_CAP];
  stage_lines(v, p, si, lines);
  const ff_rank_eval *peak = stage_peak_rank(v, st);
  bool over = peak->memory_total_bytes > peak->capacity_bytes;
  svg_rect(s, x, y, w, h, "#fbfbfb", over ? "#d62728" : "#555555", "class=\"stage\" rx=\"4\"");
  const char *attrs[STAGE_LINES] = {"font-weight=\"bold\"", "", over ? "fill=\"#d62728\"" : "", ""};
  for (int k = 0; k < STAGE_LINES; k++)
    svg_text(s, x + PAD, y + PAD + (k + 1) * LINE_H - 3, attrs[k], "%s", lines[k]);
  draw_gpus(v, st, x + PAD, y + PAD + STAGE_LINES * LINE_H + GAP, w - 2 * PAD);
}

static void draw_arrow(svg *s, double x0, double x1, double y) {
  ff_buf_printf(&s->b, "<path d=\"M%.1f %.1fH%.1f\" stroke=\"#555555\" fill=\"none\"/>\n", x0, y,
                x1 - 5);
  ff_buf_printf(&s->b, "<path d=\"M%.1f %.1fL%.1f %.1fL%.1f %.1fZ\" fill=\"#555555\"/>\n", x1 - 6,
                y - 4, x1, y, x1 - 6, y + 4);
}

static void draw_pipeline_label(const svg_view *v, int p, double y) {
  svg *s = v->s;
  const ff_plan_pipeline *pl = &v->plan->pipelines[p];
  const ff_pipeline_eval *pe = &v->e->pipelines[p];
  double x = MARGIN + PAD;
  svg_text(s, x, y + LINE_H, "font-weight=\"bold\"", "pipeline %d", p);
  svg_text(s, x, y + 2 * LINE_H, "", "batch %lld = %lld x %lld", (long long)pl->batch,
           (long long)pl->micro_batch_size, (long long)pl->micro_batches);
  int gpus = 0;
  for (int i = 0; i < pl->n_stages; i++)
    gpus += pl->stages[i].n_ranks;
  svg_text(s, x, y + 3 * LINE_H, "", "%d stage%s, %d GPU%s", pl->n_stages,
           pl->n_stages == 1 ? "" : "s", gpus, gpus == 1 ? "" : "s");
  svg_text(s, x, y + 4 * LINE_H, "", "%.4f s (+%.4f DP)", pe->seconds,
           pe->end_seconds - pe->seconds);
  svg_text(s, x, y + 5 * LINE_H, "", "bubble %.4f s", pe->bubble_seconds);
}

/* One band per pipeline: its label, then its stages left to right, STAGES_PER_LINE a line. */
static void draw_pipeline(const svg_view *v, int p) {
  svg *s = v->s;
  const ff_plan_pipeline *pl = &v->plan->pipelines[p];
  double top = s->y, y = top + GAP, label_h = 5 * LINE_H + PAD;
  double h = 0;
  for (int first = 0; first < pl->n_stages; first += STAGES_PER_LINE) {
    int n = pl->n_stages - first < STAGES_PER_LINE ? pl->n_stages - first : STAGES_PER_LINE;
    h += line_h(v, p, first, n) + (first ? GAP * 2 : 0);
  }
  h = svg_max(h, label_h);
  svg_rect(s, MARGIN, top, s->width - 2 * MARGIN, h + 2 * GAP, p % 2 ? "#ffffff" : "#f2f4f7", NULL,
           "class=\"pipeline\"");
  draw_pipeline_label(v, p, y);
  for (int first = 0; first < pl->n_stages; first += STAGES_PER_LINE) {
    int n = pl->n_stages - first < STAGES_PER_LINE ? pl->n_stages - first : STAGES_PER_LINE;
    double lh = line_h(v, p, first, n), x = MARGIN + LABEL_W;
    for (int si = first; si < first + n; si++) {
      double w = stage_w(v, p, si);
      draw_stage(v, p, si, x, y, lh);
      if (si + 1 < first + n)
        draw_arrow(s, x + w + 2, x + w + STAGE_GAP - 2, y + PAD + LINE_H / 2);
      x += w + STAGE_GAP;
    }
    y += lh + GAP * 2;
  }
  s->y = top + h + 2 * GAP + GAP;
}

/* ---- title and legend ------------------------------------------------------------------- */

static void title_lines(const svg_view *v, char lines[3][2 * LINE_CAP]) {
  const ff_plan *pl = v->plan;
  const ff_plan_eval *e = v->e;
  snprintf(lines[0], 2 * LINE_CAP, "plan %s: model %s, cluster %s, %lld rank%s, %d pipeline%s",
           pl->has_name ? pl->name : "(unnamed)", pl->model.name, pl->cluster.name,
           (long long)pl->n_ranks, pl->n_ranks == 1 ? "" : "s", pl->n_pipelines,
           pl->n_pipelines == 1 ? "" : "s");
  snprintf(lines[1], 2 * LINE_CAP,
           "predicted: iteration %.4f s | %.0f tokens/s | MFU %.1f %% | HFU %.1f %% | peak memory "
           "%.2f GiB%s",
           e->iteration_seconds, e->tokens_per_second, 100.0 * e->mfu, 100.0 * e->hfu,
           e->peak_memory_bytes / FF_GIB, e->fits ? "" : " | DOES NOT FIT");
  snprintf(lines[2], 2 * LINE_CAP,
           "global batch %lld, %s, schedule %s; per stage: layers, TP degree, memory used/capacity "
           "(largest rank), fwd/bwd per micro-batch",
           (long long)pl->training.global_batch, ff_precision_names[pl->training.precision],
           ff_schedule_names[pl->training.schedule]);
}

static void draw_title(const svg_view *v) {
  svg *s = v->s;
  char lines[3][2 * LINE_CAP];
  title_lines(v, lines);
  svg_text(s, MARGIN, s->y + 18, "font-size=\"16\" font-weight=\"bold\" class=\"title\"", "%s",
           lines[0]);
  svg_text(s, MARGIN, s->y + 18 + LINE_H + 4, v->e->fits ? "" : "fill=\"#d62728\"", "%s", lines[1]);
  svg_text(s, MARGIN, s->y + 18 + 2 * LINE_H + 4, "fill=\"#555555\"", "%s", lines[2]);
  s->y += 18 + 2 * LINE_H + 4 + GAP;
}

static int64_t ranks_on_device(const ff_plan *plan, int device) {
  int64_t n = 0;
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++)
      for (int t = 0; t < plan->pipelines[p].stages[s].n_ranks; t++)
        n += plan->pipelines[p].stages[s].ranks[t].device == device;
  return n;
}

static void draw_legend(const svg_view *v) {
  svg *s = v->s;
  const ff_cluster *c = &v->plan->cluster;
  svg_heading(s, "device types", NULL);
  double x = MARGIN, y = s->y;
  for (int d = 0; d < c->n_devices; d++) {
    int64_t gpus = 0;
    for (int n = 0; n < c->n_nodes; n++)
      gpus += c->nodes[n].device == d ? c->nodes[n].gpus : 0;
    char label[160];
    snprintf(label, sizeof label, "%s  %g GiB  %lld of %lld GPU%s used", c->devices[d].name,
             c->devices[d].memory_gib, (long long)ranks_on_device(v->plan, d), (long long)gpus,
             gpus == 1 ? "" : "s");
    double w = 20 + svg_text_w(label, CHAR_W) + 18;
    if (x > MARGIN && x + w > s->width - MARGIN)
      x = MARGIN, y += LINE_H + GAP * 2;
    svg_rect(s, x, y, 14, 14, svg_fill(d), svg_stroke(d), "class=\"swatch\"");
    svg_text(s, x + 20, y + 11, "", "%s", label);
    x += w;
  }
  s->y = y + LINE_H + GAP * 2;
}

/* ---- the cluster's nodes ---------------------------------------------------------------- */

static int shown_gpus(const ff_node *n) {
  return n->gpus < MAX_NODE_GPUS ? n->gpus : MAX_NODE_GPUS;
}

static void node_header(const ff_plan *plan, int n, char *out, size_t cap) {
  const ff_node *nd = &plan->cluster.nodes[n];
  snprintf(out, cap, "%s  %s", nd->name, plan->cluster.devices[nd->device].name);
}

static double node_w(const svg_view *v, int n) {
  char h[160];
  node_header(v->plan, n, h, sizeof h);
  int g = shown_gpus(&v->plan->cluster.nodes[n]);
  int cols = g < NODE_COLS ? g : NODE_COLS;
  return svg_max(svg_text_w(h, CHAR_W), cols * (v->cell_w + 2) - 2) + 2 * PAD;
}

static double node_h(const svg_view *v, int n) {
  const ff_node *nd = &v->plan->cluster.nodes[n];
  int rows = (shown_gpus(nd) + NODE_COLS - 1) / NODE_COLS;
  return PAD + LINE_H + rows * (CELL_H + 2) + (nd->gpus > MAX_NODE_GPUS ? LINE_H : 0) + PAD;
}

/* at[g]: the rank on GPU g of node n, or -1 for an idle GPU. */
static void node_ranks(const ff_plan *plan, int n, int64_t *at) {
  for (int g = 0; g < shown_gpus(&plan->cluster.nodes[n]); g++)
    at[g] = -1;
  for (int p = 0; p < plan->n_pipelines; p++)
    for (int s = 0; s < plan->pipelines[p].n_stages; s++)
      for (int t = 0; t < plan->pipelines[p].stages[s].n_ranks; t++) {
        const ff_plan_rank *r = &plan->pipelines[p].stages[s].ranks[t];
        if (r->node == n && r->gpu < MAX_NODE_GPUS)
          at[r->gpu] = r->rank;
      }
}

static void draw_node(const svg_view *v, int n, double x, double y) {
  svg *s = v->s;
  const ff_node *nd = &v->plan->cluster.nodes[n];
  int64_t at[MAX_NODE_GPUS];
  char h[160];
  node_ranks(v->plan, n, at);
  node_header(v->plan, n, h, sizeof h);
  svg_rect(s, x, y, node_w(v, n), node_h(v, n), "#ffffff", svg_stroke(nd->device),
           "class=\"cluster-node\" rx=\"4\"");
  svg_text(s, x + PAD, y + PAD + LINE_H - 4, "font-weight=\"bold\"", "%s", h);
  for (int g = 0; g < shown_gpus(nd); g++) {
    double cx = x + PAD + (g % NODE_COLS) * (v->cell_w + 2);
    double cy = y + PAD + LINE_H + (g / NODE_COLS) * (CELL_H + 2);
    if (at[g] >= 0) {
      svg_rect(s, cx, cy, v->cell_w, CELL_H, svg_fill(nd->device), svg_stroke(nd->device), "");
      svg_text(s, cx + v->cell_w / 2, cy + 13, "text-anchor=\"middle\" font-size=\"9\"", "r%lld",
               (long long)at[g]);
    } else {
      svg_rect(s, cx, cy, v->cell_w, CELL_H, "#ffffff", "#999999", "stroke-dasharray=\"3 2\"");
      svg_text(s, cx + v->cell_w / 2, cy + 13,
               "text-anchor=\"middle\" font-size=\"9\" fill=\"#999999\"", "idle");
    }
  }
  if (nd->gpus > MAX_NODE_GPUS)
    svg_text(s, x + PAD, y + node_h(v, n) - PAD - 3, "font-size=\"9\"", "+%d more GPUs not drawn",
             nd->gpus - MAX_NODE_GPUS);
}

static void draw_cluster(const svg_view *v) {
  svg *s = v->s;
  const ff_cluster *c = &v->plan->cluster;
  int n_shown = c->n_nodes < MAX_NODES ? c->n_nodes : MAX_NODES;
  svg_heading(s, "nodes", "every GPU of the cluster with the rank it runs (dashed: idle)");
  double x = MARGIN, y = s->y, row_h = 0;
  for (int n = 0; n < n_shown; n++) {
    double w = node_w(v, n);
    if (x > MARGIN && x + w > s->width - MARGIN)
      x = MARGIN, y += row_h + GAP * 2, row_h = 0;
    draw_node(v, n, x, y);
    row_h = svg_max(row_h, node_h(v, n));
    x += w + GAP * 2;
  }
  s->y = y + row_h + GAP;
  if (c->n_nodes > n_shown) {
    s->y += LINE_H;
    svg_text(s, MARGIN, s->y, "", "… %d more node%s not drawn", c->n_nodes - n_shown,
             c->n_nodes - n_shown == 1 ? "" : "s");
    s->y += GAP;
  }
}

/* ---- the document ----------------------------------------------------------------------- */

static int digits(int64_t x) {
  int d = 1;
  for (; x >= 10; x /= 10)
    d++;
  return d;
}

/* Box sizes that fit the largest rank and GPU numbers, and the drawing's width. */
static void layout(svg_view *v) {
  const ff_plan *pl = v->plan;
  int max_gpu = 0;
  for (int n = 0; n < pl->cluster.n_nodes; n++)
    max_gpu = pl->cluster.nodes[n].gpus > max_gpu ? pl->cluster.nodes[n].gpus : max_gpu;
  int rd = digits(pl->n_ranks > 0 ? pl->n_ranks - 1 : 0);
  v->gpu_w = svg_max(40, svg_max((rd + 1) * CHAR_W + 6, (4 + digits(max_gpu)) * SMALL_W + 6));
  v->cell_w = svg_max(28, (rd + 1) * SMALL_W + 6);
  double w = MIN_WIDTH;
  for (int p = 0; p < pl->n_pipelines; p++)
    for (int first = 0; first < pl->pipelines[p].n_stages; first += STAGES_PER_LINE) {
      int n = pl->pipelines[p].n_stages - first;
      w = svg_max(w, 2 * MARGIN + LABEL_W +
                         line_w(v, p, first, n < STAGES_PER_LINE ? n : STAGES_PER_LINE) + PAD);
    }
  char lines[3][2 * LINE_CAP];
  title_lines(v, lines);
  w = svg_max(w, 2 * MARGIN + svg_text_w(lines[0], 9.7));
  w = svg_max(w, 2 * MARGIN + svg_max(svg_text_w(lines[1], CHAR_W), svg_text_w(lines[2], CHAR_W)));
  for (int n = 0; n < pl->cluster.n_nodes && n < MAX_NODES; n++)
    w = svg_max(w, 2 * MARGIN + node_w(v, n));
  v->s->width = ceil(w);
}

/* The <svg> element around the body, sized to what was drawn. */
static void write_document(const svg_view *v, ff_buf *out) {
  const svg *s = v->s;
  double h = ceil(s->y + MARGIN);
  ff_buf_printf(out,
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                "viewBox=\"0 0 %.0f %.0f\" font-family=\"%s\" font-size=\"11\">\n",
                s->width, h, s->width, h, SVG_FONT);
  ff_buf_puts(out, "<title>ffplan svg: ");
  svg_escaped(out, v->plan->has_name ? v->plan->name : "(unnamed plan)");
  ff_buf_puts(out, "</title>\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
  ff_buf_put(out, s->b.data, s->b.len);
  ff_buf_puts(out, "</svg>\n");
}

static ff_status render(svg_view *v, bool timeline, ff_buf *out) {
  svg *s = v->s;
  layout(v);
  s->y = MARGIN;
  draw_title(v);
  draw_legend(v);
  svg_heading(s, "pipelines",
              "one row per pipeline (data parallel); its stages left to right "
              "(pipeline parallel), each with its TP group of GPUs on its node");
  for (int p = 0; p < v->plan->n_pipelines; p++)
    draw_pipeline(v, p);
  draw_cluster(v);
  ff_status st = timeline ? svg_draw_timeline(v) : FF_OK;
  if (st != FF_OK)
    return st;
  write_document(v, out);
  if (s->b.failed || out->failed) {
    fprintf(stderr, "ffplan svg: out of memory while drawing\n");
    return FF_ERR_RUNTIME;
  }
  return FF_OK;
}

typedef struct svg_args {
  const char *plan_file, *out_file;
  bool timeline;
} svg_args;

static int parse_args(int argc, char **argv, svg_args *a) {
  *a = (svg_args){NULL, NULL, false};
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--timeline") == 0) {
      a->timeline = true;
    } else if (strcmp(argv[i], "-o") == 0) {
      if (i + 1 >= argc) {
        fprintf(stderr, "ffplan svg: -o needs a FILE (- for standard output)\n");
        return FF_ERR_INPUT;
      }
      a->out_file = argv[++i];
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "ffplan svg: unknown option %s (see ffplan --help)\n", argv[i]);
      return FF_ERR_INPUT;
    } else if (!a->plan_file) {
      a->plan_file = argv[i];
    } else {
      fprintf(stderr, "ffplan svg: expected one PLAN\n");
      return FF_ERR_INPUT;
    }
  }
  if (!a->plan_file || !a->out_file) {
    fprintf(stderr, "ffplan svg: expected PLAN -o FILE.svg (-o - for standard output)\n"
                    "usage: ffplan svg PLAN -o FILE.svg [--timeline]\n");
    return FF_ERR_INPUT;
  }
  return FF_OK;
}

static int draw_and_write(const ff_plan *plan, const ff_plan_eval *e, const svg_args *a) {
  svg s = {{0}, 0, 0};
  svg_view v = {plan, e, &s, 0, 0};
  ff_buf out = {0};
  ff_status st = render(&v, a->timeline, &out);
  if (st == FF_OK) {
    ff_diag d;
    ff_diag_init(&d, a->out_file);
    st = ff_write_file_atomic(a->out_file, out.data, out.len, &d);
    ff_diag_print(&d, stderr);
    ff_diag_free(&d);
  }
  if (st == FF_OK && !e->fits)
    fprintf(stderr,
            "ffplan svg: warning: %s: %lld of %lld ranks need more memory than their GPU "
            "has (drawn in red)\n",
            a->plan_file, (long long)e->ranks_over_memory, (long long)plan->n_ranks);
  ff_buf_free(&out);
  ff_buf_free(&s.b);
  return st;
}

int ffplan_cmd_svg(int argc, char **argv) {
  svg_args a;
  int rc = parse_args(argc, argv, &a);
  if (rc != FF_OK)
    return rc;
  ff_plan plan;
  ff_plan_eval e;
  if ((rc = ffplan_load_and_eval(a.plan_file, &plan, &e)) != FF_OK)
    return rc;
  rc = draw_and_write(&plan, &e, &a);
  ff_plan_eval_free(&e);
  ff_plan_free(&plan);
  return rc;
}
