/* partition.c — METIS partitions of the device graph as node orders (see partition.h).
 *
 * Up to 512 nodes the graph is complete (every pair's link); above it only the links faster
 * than the slowest bandwidth are edges (overrides, and each group as a clique, or a chain above
 * 256 members), since the slowest links join everything and cost the same wherever they are cut.
 * Vertices are numbered in the canonical order and METIS runs with a fixed seed, so the result
 * depends on the links, not on how the file lists or names its nodes, and is the same on every
 * run. Edge weights are bandwidths scaled to 1..1000 (so cut sums fit METIS's 32-bit integers);
 * vertex weights are peak TFLOP/s and GiB, two balance constraints (5 % and 50 % imbalance). */
#include "partition.h"

#include <math.h>
#include <metis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COMPLETE_MAX_NODES 512
#define GROUP_CLIQUE_MAX 256
#define SUBSET_MAX_NODES 64

void ff_node_orders_free(ff_node_orders *o) {
  for (int i = 0; i < o->n; i++)
    free(o->items[i].order), free(o->items[i].part);
  free(o->items);
  memset(o, 0, sizeof *o);
}

typedef struct edges {
  idx_t *u, *v, *w;
  size_t n, cap;
} edges;

static bool edge_add(edges *e, idx_t u, idx_t v, idx_t w) {
  if (e->n == e->cap) {
    size_t cap = e->cap ? 2 * e->cap : 1024;
    idx_t *nu = realloc(e->u, cap * sizeof *nu);
    if (!nu)
      return false;
    e->u = nu;
    idx_t *nv = realloc(e->v, cap * sizeof *nv);
    if (!nv)
      return false;
    e->v = nv;
    idx_t *nw = realloc(e->w, cap * sizeof *nw);
    if (!nw)
      return false;
    e->w = nw;
    e->cap = cap;
  }
  e->u[e->n] = u, e->v[e->n] = v, e->w[e->n] = w;
  e->n++;
  return true;
}

typedef struct pgraph {
  idx_t n;
  idx_t *xadj, *adjncy, *adjwgt, *vwgt;
} pgraph;

static void pgraph_free(pgraph *p) {
  free(p->xadj), free(p->adjncy), free(p->adjwgt), free(p->vwgt);
  memset(p, 0, sizeof *p);
}

static idx_t scaled_weight(double bw, double bw_max) {
  double w = round(1000.0 * bw / bw_max);
  return w < 1 ? 1 : (idx_t)w;
}

/* The METIS graph over the active nodes `nodes[0..n)` (canonical order). */
static bool build_pgraph(const ff_graph *g, const int *nodes, int n, pgraph *p) {
  const ff_cluster *c = g->cluster;
  edges e = {0};
  int *pos = malloc((size_t)c->n_nodes * sizeof *pos);
  bool ok = pos != NULL;
  double bw_max = g->levels[g->n_levels - 1], slowest = g->levels[0];
  for (int i = 0; ok && i < c->n_nodes; i++)
    pos[i] = -1;
  for (int i = 0; ok && i < n; i++)
    pos[nodes[i]] = i;
  if (ok && n <= COMPLETE_MAX_NODES) {
    for (int i = 0; ok && i < n; i++)
      for (int j = i + 1; ok && j < n; j++)
        ok = edge_add(&e, i, j,
                      scaled_weight(ff_graph_link(g, nodes[i], nodes[j]).bandwidth_gb_per_s,
                                    bw_max));
  } else if (ok) {
    for (int i = 0; ok && i < g->n_ov; i++) {
      int a = pos[g->ov_a[i]], b = pos[g->ov_b[i]];
      if (a >= 0 && b >= 0 && g->ov_link[i].bandwidth_gb_per_s > slowest)
        ok = edge_add(&e, a, b, scaled_weight(g->ov_link[i].bandwidth_gb_per_s, bw_max));
    }
    for (int gi = 0; ok && gi < c->n_groups; gi++) {
      const ff_net_group *grp = &c->groups[gi];
      if (grp->link.bandwidth_gb_per_s <= slowest)
        continue;
      for (int x = 0; ok && x < grp->n_nodes; x++)
        for (int y = x + 1; ok && y < grp->n_nodes; y++) {
          if (grp->n_nodes > GROUP_CLIQUE_MAX && y > x + 1)
            break; /* a chain */
          int a = pos[grp->nodes[x]], b = pos[grp->nodes[y]];
          if (a < 0 || b < 0)
            continue;
          ff_link l = ff_graph_link(g, grp->nodes[x], grp->nodes[y]);
          if (l.bandwidth_gb_per_s > slowest)
            ok = edge_add(&e, a, b, scaled_weight(l.bandwidth_gb_per_s, bw_max));
        }
    }
  }
  /* An edge may have been listed twice (an override inside a group, once as the override and once
   * in the group's clique; both carry the pair's link): METIS accepts no duplicates, so each
   * adjacency list is sorted and a repeated neighbour is kept once. */
  p->n = n;
  p->xadj = calloc((size_t)n + 1, sizeof *p->xadj);
  p->adjncy = malloc((2 * e.n + 1) * sizeof *p->adjncy);
  p->adjwgt = malloc((2 * e.n + 1) * sizeof *p->adjwgt);
  p->vwgt = malloc(2 * ((size_t)n + 1) * sizeof *p->vwgt);
  ok = ok && p->xadj && p->adjncy && p->adjwgt && p->vwgt;
  if (ok) {
    for (size_t k = 0; k < e.n; k++)
      p->xadj[e.u[k] + 1]++, p->xadj[e.v[k] + 1]++;
    for (int i = 0; i < n; i++)
      p->xadj[i + 1] += p->xadj[i];
    idx_t *fill = malloc(((size_t)n + 1) * sizeof *fill);
    ok = fill != NULL;
    if (ok) {
      memcpy(fill, p->xadj, ((size_t)n + 1) * sizeof *fill);
      for (size_t k = 0; k < e.n; k++) {
        p->adjncy[fill[e.u[k]]] = e.v[k], p->adjwgt[fill[e.u[k]]++] = e.w[k];
        p->adjncy[fill[e.v[k]]] = e.u[k], p->adjwgt[fill[e.v[k]]++] = e.w[k];
      }
      free(fill);
      /* Merge duplicates in place (insertion sort per list: lists are short or already sorted). */
      idx_t out = 0;
      for (int i = 0; i < n; i++) {
        idx_t from = p->xadj[i], to = p->xadj[i + 1], start = out;
        for (idx_t k = from; k < to; k++) {
          idx_t v = p->adjncy[k], w = p->adjwgt[k], at = out;
          while (at > start && p->adjncy[at - 1] > v)
            at--;
          if (at > start && p->adjncy[at - 1] == v) {
            p->adjwgt[at - 1] = p->adjwgt[at - 1] > w ? w : p->adjwgt[at - 1];
            continue;
          }
          memmove(p->adjncy + at + 1, p->adjncy + at, (size_t)(out - at) * sizeof *p->adjncy);
          memmove(p->adjwgt + at + 1, p->adjwgt + at, (size_t)(out - at) * sizeof *p->adjwgt);
          p->adjncy[at] = v, p->adjwgt[at] = w;
          out++;
        }
        p->xadj[i] = start;
      }
      p->xadj[n] = out;
    }
  }
  for (int i = 0; ok && i < n; i++) {
    const ff_node *nd = &c->nodes[nodes[i]];
    const ff_device *dev = &c->devices[nd->device];
    double tflops = ff_peak_flops(dev, g->precision) * 1e-12 * nd->gpus;
    p->vwgt[2 * i] = tflops < 1 ? 1 : (idx_t)llround(tflops);
    double gib = dev->memory_gib * nd->gpus;
    p->vwgt[2 * i + 1] = gib < 1 ? 1 : (idx_t)llround(gib);
  }
  free(e.u), free(e.v), free(e.w), free(pos);
  if (!ok)
    pgraph_free(p);
  return ok;
}

/* Partition into k parts; false when METIS refuses or leaves a part empty. */
static bool metis_parts(pgraph *p, idx_t k, idx_t seed, idx_t *part) {
  idx_t options[METIS_NOPTIONS];
  METIS_SetDefaultOptions(options);
  options[METIS_OPTION_SEED] = seed;
  options[METIS_OPTION_NUMBERING] = 0;
  idx_t ncon = 2, objval = 0, n = p->n;
  real_t ubvec[2] = {1.05f, 1.5f};
  int (*partition)(idx_t *, idx_t *, idx_t *, idx_t *, idx_t *, idx_t *, idx_t *, idx_t *,
                   real_t *, real_t *, idx_t *, idx_t *, idx_t *) =
      k <= 8 ? METIS_PartGraphRecursive : METIS_PartGraphKway;
  int rc = partition(&n, &ncon, p->xadj, p->adjncy, p->vwgt, NULL, p->adjwgt, &k, NULL, ubvec,
                     options, &objval, part);
  if (rc != METIS_OK)
    return false;
  for (idx_t q = 0; q < k; q++) {
    bool used = false;
    for (idx_t i = 0; i < n && !used; i++)
      used = part[i] == q;
    if (!used)
      return false;
  }
  return true;
}

typedef struct part_key {
  double flops;
  int first; /* position of its first node in the canonical order */
  int id;
} part_key;

static int cmp_part_key(const void *a, const void *b) {
  const part_key *x = a, *y = b;
  if (x->flops != y->flops)
    return x->flops > y->flops ? -1 : 1;
  return x->first < y->first ? -1 : (x->first > y->first);
}

/* Turn a partition into an order: parts by compute (largest first), nodes in canonical order. */
static bool order_from_parts(const ff_graph *g, const int *nodes, int n, const idx_t *part, int k,
                             ff_node_order *o) {
  part_key *keys = calloc((size_t)k, sizeof *keys);
  int *rank = malloc((size_t)k * sizeof *rank);
  o->order = malloc((size_t)n * sizeof *o->order);
  o->part = malloc((size_t)n * sizeof *o->part);
  if (!keys || !rank || !o->order || !o->part) {
    free(keys), free(rank);
    return false;
  }
  for (int q = 0; q < k; q++)
    keys[q] = (part_key){0, n, q};
  for (int i = 0; i < n; i++) {
    const ff_node *nd = &g->cluster->nodes[nodes[i]];
    keys[part[i]].flops += ff_peak_flops(&g->cluster->devices[nd->device], g->precision) * nd->gpus;
    if (i < keys[part[i]].first)
      keys[part[i]].first = i;
  }
  qsort(keys, (size_t)k, sizeof *keys, cmp_part_key);
  for (int q = 0; q < k; q++)
    rank[keys[q].id] = q;
  int at = 0;
  for (int q = 0; q < k; q++)
    for (int i = 0; i < n; i++)
      if (rank[part[i]] == q) {
        o->order[at] = nodes[i];
        o->part[at++] = q;
      }
  o->n = n;
  o->n_parts = k;
  free(keys), free(rank);
  return true;
}

static bool same_order(const ff_node_order *a, const ff_node_order *b) {
  return a->n == b->n && a->n_parts == b->n_parts &&
         memcmp(a->order, b->order, (size_t)a->n * sizeof *a->order) == 0 &&
         memcmp(a->part, b->part, (size_t)a->n * sizeof *a->part) == 0;
}

/* The order just written at out->items[out->n] is kept (true) unless an earlier non-canonical
 * order equals it; a duplicate is freed. */
static bool keep_if_new(ff_node_orders *out, ff_node_order *o) {
  for (int i = 1; i < out->n; i++)
    if (same_order(&out->items[i], o)) {
      free(o->order), free(o->part);
      memset(o, 0, sizeof *o);
      return false;
    }
  return true;
}

/* The link clusters as parts, without METIS: the top-level clusters (sites, racks) in
 * canonical order and reversed, and the finest clusters when there are more of them. */
static bool add_cluster_orders(const ff_graph *g, const bool *active_device, ff_node_orders *out) {
  const ff_cluster *c = g->cluster;
  for (int variant = 0; variant < 3; variant++) {
    const int *cluster_of = variant == 2 ? g->leaf_of : g->top_of;
    ff_node_order *o = &out->items[out->n];
    o->order = malloc(((size_t)c->n_nodes + 1) * sizeof *o->order);
    o->part = malloc(((size_t)c->n_nodes + 1) * sizeof *o->part);
    if (!o->order || !o->part) {
      free(o->order), free(o->part);
      memset(o, 0, sizeof *o);
      return false;
    }
    /* Segments of equal cluster id among active nodes, renumbered 0.. in order. */
    int n = 0, parts = 0, last = -1;
    for (int i = 0; i < c->n_nodes; i++) {
      if (!active_device[c->nodes[g->order[i]].device])
        continue;
      if (cluster_of[i] != last)
        parts++, last = cluster_of[i];
      o->order[n] = g->order[i];
      o->part[n++] = parts - 1;
    }
    if (variant == 1) { /* the top-level clusters in reverse (slowest first), each kept as is */
      int *tmp = malloc(2 * ((size_t)n + 1) * sizeof *tmp), at = 0;
      if (!tmp) {
        free(o->order), free(o->part);
        memset(o, 0, sizeof *o);
        return false;
      }
      for (int q = parts - 1; q >= 0; q--)
        for (int i = 0; i < n; i++)
          if (o->part[i] == q) {
            tmp[at] = o->order[i];
            tmp[n + 1 + at++] = parts - 1 - q;
          }
      memcpy(o->order, tmp, (size_t)n * sizeof *tmp);
      memcpy(o->part, tmp + n + 1, (size_t)n * sizeof *tmp);
      free(tmp);
    }
    o->n = n;
    o->n_parts = parts;
    if (parts <= 1) { /* one cluster: the canonical order already covers it */
      free(o->order), free(o->part);
      memset(o, 0, sizeof *o);
      continue;
    }
    if (!keep_if_new(out, o))
      continue;
    snprintf(o->what, sizeof o->what, "%s",
             variant == 0 ? "link clusters" : variant == 1 ? "link clusters, slowest first"
                                                           : "finest link clusters");
    out->n++;
  }
  return true;
}

/* Each part of the top-level link clusters (2 to 8 parts) and of the two-part METIS partitions
 * as an order of its own (the other parts idle). The orders are appended; `out` has room. */
static bool add_subset_orders(ff_node_orders *out) {
  int n_before = out->n;
  for (int i = 1; i < n_before; i++) {
    const ff_node_order *from = &out->items[i];
    bool clusters = strcmp(from->what, "link clusters") == 0;
    bool halves = strncmp(from->what, "METIS k=2 ", 10) == 0;
    if (!(clusters && from->n_parts <= 8) && !halves)
      continue;
    for (int q = 0; q < from->n_parts; q++) {
      ff_node_order *o = &out->items[out->n];
      o->order = malloc(((size_t)from->n + 1) * sizeof *o->order);
      o->part = calloc((size_t)from->n + 1, sizeof *o->part);
      if (!o->order || !o->part) {
        free(o->order), free(o->part);
        memset(o, 0, sizeof *o);
        return false;
      }
      for (int k = 0; k < from->n; k++)
        if (from->part[k] == q)
          o->order[o->n++] = from->order[k];
      o->n_parts = 1;
      o->subset = true;
      o->metis = from->metis;
      if (!keep_if_new(out, o))
        continue;
      snprintf(o->what, sizeof o->what, "part %d of the %s alone", q + 1, from->what);
      out->n++;
    }
  }
  return true;
}

ff_status ff_partition_orders(const ff_graph *g, const bool *active_device, bool use_metis,
                              int max_k, int n_seeds, ff_node_orders *out) {
  const ff_cluster *c = g->cluster;
  memset(out, 0, sizeof *out);
  int cap = 4 + 8 + 2 * n_seeds + (use_metis ? (max_k > 1 ? max_k - 1 : 0) * n_seeds : 0);
  out->items = calloc((size_t)cap, sizeof *out->items);
  int *nodes = malloc(((size_t)c->n_nodes + 1) * sizeof *nodes);
  idx_t *part = malloc(((size_t)c->n_nodes + 1) * sizeof *part);
  pgraph p = {0};
  ff_status st = FF_ERR_RUNTIME;
  if (!out->items || !nodes || !part)
    goto done;
  int n = 0;
  for (int i = 0; i < c->n_nodes; i++)
    if (active_device[c->nodes[g->order[i]].device])
      nodes[n++] = g->order[i];
  ff_node_order *canon = &out->items[out->n++];
  canon->order = malloc(((size_t)n + 1) * sizeof *canon->order);
  canon->part = calloc((size_t)n + 1, sizeof *canon->part);
  if (!canon->order || !canon->part)
    goto done;
  memcpy(canon->order, nodes, (size_t)n * sizeof *nodes);
  canon->n = n;
  canon->n_parts = 1;
  snprintf(canon->what, sizeof canon->what, "canonical order");
  if (!add_cluster_orders(g, active_device, out))
    goto done;
  if (use_metis && n >= 3 && max_k >= 2) {
    if (!build_pgraph(g, nodes, n, &p))
      goto done;
    for (int k = 2; k <= max_k && k < n; k++)
      for (int s = 1; s <= n_seeds; s++) {
        if (!metis_parts(&p, k, s, part))
          continue;
        ff_node_order *o = &out->items[out->n];
        if (!order_from_parts(g, nodes, n, part, k, o)) {
          free(o->order), free(o->part);
          memset(o, 0, sizeof *o);
          goto done;
        }
        if (!keep_if_new(out, o))
          continue;
        snprintf(o->what, sizeof o->what, "METIS k=%d seed %d", k, s);
        o->metis = true;
        out->n++;
      }
  }
  if (c->n_nodes <= SUBSET_MAX_NODES && !add_subset_orders(out))
    goto done;
  st = FF_OK;
done:
  pgraph_free(&p);
  free(nodes), free(part);
  if (st != FF_OK)
    ff_node_orders_free(out);
  return st;
}
