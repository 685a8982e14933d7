/* cmd_svg.h — what the two halves of `ffplan svg` share (cmd_svg.c: the document, the plan's
 * structure and the command; cmd_svg_timeline.c: the simulated schedule): the drawing being
 * built, the layout constants and the few SVG primitives. Internal to those two files. */
#ifndef CMD_SVG_H
#define CMD_SVG_H

#include "ff_cost.h"

/* Layout in px. Text is monospace, so a string is about its length times CHAR_W wide. */
#define SVG_FONT "DejaVu Sans Mono, Menlo, Consolas, monospace"
#define CHAR_W 6.7  /* 11 px text */
#define SMALL_W 5.5 /* 9 px text */
#define LINE_H 14.0
#define MARGIN 16.0
#define LABEL_W 176.0 /* the left column: pipeline and lane labels */
#define GAP 4.0
#define PAD 6.0

typedef struct svg {
  ff_buf b;     /* the body, between the <svg> header and footer */
  double width; /* fixed before anything is drawn */
  double y;     /* top of the next free row */
} svg;

typedef struct svg_view {
  const ff_plan *plan;
  const ff_plan_eval *e;
  svg *s;
  double gpu_w, cell_w; /* GPU boxes in stages, GPU cells in nodes: wide enough for "rN" */
} svg_view;

/* Append t with the five XML special characters escaped. */
void svg_escaped(ff_buf *b, const char *t);
/* <text> at (x, y) with extra attributes (may be ""); the content is formatted and escaped. */
void svg_text(svg *s, double x, double y, const char *attrs, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* <rect>; stroke may be NULL; extra attributes (may be ""). */
void svg_rect(svg *s, double x, double y, double w, double h, const char *fill, const char *stroke,
              const char *attrs);
/* A bold section heading and, when note is not NULL, a grey line under it. */
void svg_heading(svg *s, const char *title, const char *note);
double svg_text_w(const char *t, double char_w);
double svg_max(double a, double b);
/* The fixed palette, by the device type's index in inputs.cluster.device_types: a light fill
 * and a dark stroke per device type. */
const char *svg_fill(int device);
const char *svg_stroke(int device);

/* The simulated schedule of each pipeline (the first 16), one lane per stage. */
ff_status svg_draw_timeline(const svg_view *v);

#endif
